"""A small character-level transformer language model for PyTorch ablations (docs/ablations.md, "PyTorch
models"): pre-LayerNorm blocks of causal nn.MultiheadAttention and a GELU MLP, a learned position table,
and the output layer tied to the embedding — python/examples/train_compare.py's CharLM, as a factory.

    "model": {"python": "experiments/ablations/models/char_lm.py:make_model", "d": 64, "layers": 2}

`vocab` and `context` come from the data ("text:PATH[:ctx=N]") when the config does not set them.
"""
import torch
from torch import nn
import torch.nn.functional as F


class CharLM(nn.Module):
    def __init__(self, vocab: int, context: int, d: int, heads: int, layers: int):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(context, d) * 0.02)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({
                "ln1": nn.LayerNorm(d), "attn": nn.MultiheadAttention(d, heads, batch_first=True),
                "ln2": nn.LayerNorm(d), "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d)}))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight  # tied: one parameter, trained by both uses
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        h = self.emb(idx) + self.pos[:t]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
        for b in self.blocks:
            a = b["ln1"](h)
            h = h + b["attn"](a, a, a, attn_mask=mask, need_weights=False)[0]
            h = h + b["down"](F.gelu(b["up"](b["ln2"](h))))
        return self.out(self.ln(h))


def make_model(vocab: int, context: int = 64, d: int = 64, heads: int = 4, layers: int = 2) -> nn.Module:
    return CharLM(vocab, context, d, heads, layers)
