"""Trains a small PyTorch model on the CPU under several loss-scaling policies with emulated
low-precision storage, and prints one Markdown table row per run: accuracy or loss, skipped steps,
the underflow rate of the loss gradient (S0·g rounded to the gradient format) and the mean underflow
rate of the gradients the layers sent upstream, over the steps with statistics (every 10th).

    .venv/bin/python python/examples/train_compare.py --model cnn --steps 300
    .venv/bin/python python/examples/train_compare.py --model charlm --steps 300

Models: `cnn`, a ResNet-style CNN (conv-BN-ReLU stem, two residual blocks, a head) on Fashion-MNIST
(Debian's dataset-fashion-mnist; synthetic images if it is absent); `charlm`, a two-block character
transformer language model (attention, LayerNorm, GELU, tied embedding) on the text of the GPL-3
licence that every Debian system ships (/usr/share/common-licenses/GPL-3).
"""
from __future__ import annotations

import argparse
import gzip
import math
import os
import struct
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gradscale.torch import Scaler  # noqa: E402

FMNIST = "/usr/share/datasets/fashion-mnist"
TEXT = "/usr/share/common-licenses/GPL-3"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def fashion(n_train, n_test):
    try:
        xs = read_idx(os.path.join(FMNIST, "train-images-idx3-ubyte.gz"))[:n_train + n_test].float() / 255
        ys = read_idx(os.path.join(FMNIST, "train-labels-idx1-ubyte.gz"))[:n_train + n_test].long()
        source = "fashion-mnist"
    except OSError:
        g = torch.Generator().manual_seed(0)
        ys = torch.randint(0, 10, (n_train + n_test,), generator=g)
        xs = torch.randn(n_train + n_test, 28, 28, generator=g) * 0.3 + ys.view(-1, 1, 1) / 10
        source = "synthetic"
    xs = ((xs - 0.2860) / 0.3530).unsqueeze(1)
    return (xs[:n_train], ys[:n_train]), (xs[n_train:], ys[n_train:]), source


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class ResNetMini(nn.Module):
    def __init__(self, c=16):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(1, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.blocks = nn.Sequential(Block(c), nn.MaxPool2d(2), Block(c), nn.MaxPool2d(2))
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        return self.head(self.blocks(F.relu(self.bn(self.stem(x)))).mean(dim=(2, 3)))


class CharLM(nn.Module):
    def __init__(self, vocab, d=64, heads=4, layers=2, ctx=64):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(ctx, d) * 0.02)
        self.blocks = nn.ModuleList()
        for _ in range(layers):
            self.blocks.append(nn.ModuleDict({"ln1": nn.LayerNorm(d), "attn": nn.MultiheadAttention(d, heads, batch_first=True),
                                              "ln2": nn.LayerNorm(d), "up": nn.Linear(d, 4 * d), "down": nn.Linear(4 * d, d)}))
        self.ln = nn.LayerNorm(d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight
        nn.init.normal_(self.emb.weight, std=0.02)

    def forward(self, idx):
        t = idx.shape[1]
        h = self.emb(idx) + self.pos[:t]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
        for b in self.blocks:
            a = b["ln1"](h)
            h = h + b["attn"](a, a, a, attn_mask=mask, need_weights=False)[0]
            h = h + b["down"](F.gelu(b["up"](b["ln2"](h))))
        return self.out(self.ln(h))


POLICIES = {
    "none": "none",
    "gradscale torch": "torch",
    "adaptive measured": {"policy": "adaptive", "method": "measured", "init_scale": "auto", "cast_form": "measured"},
    "adaptive approx_range": {"policy": "adaptive", "method": "approx_range", "init_scale": "auto"},
}


def run(model_name, grad_format, policy, steps, seed, batch):
    torch.manual_seed(seed)
    if model_name == "cnn":
        (xtr, ytr), (xte, yte), source = fashion(6000, 2000)
        model = ResNetMini()
        lr = 0.05
    else:
        text = open(TEXT, encoding="utf-8").read()
        chars = sorted(set(text))
        data = torch.tensor([chars.index(c) for c in text])
        split = int(len(data) * 0.9)
        model = CharLM(len(chars))
        source, lr = "GPL-3 text", 3e-3
    scaler = Scaler(model, scaler=policy, format="fp16", grad_format=grad_format, record_every=10)
    opt = (torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9) if model_name == "cnn"
           else torch.optim.Adam(model.parameters(), lr=lr))
    g = torch.Generator().manual_seed(seed)
    underflow, loss_underflow, t0 = [], [], time.time()
    for step in range(steps):
        model.train()
        if model_name == "cnn":
            i = torch.randint(0, len(xtr), (batch,), generator=g)
            loss = F.cross_entropy(model(xtr[i]), ytr[i])
        else:
            i = torch.randint(0, split - 65, (batch,), generator=g)
            seq = torch.stack([data[j:j + 65] for j in i.tolist()])
            loss = F.cross_entropy(model(seq[:, :-1]).reshape(-1, len(chars)), seq[:, 1:].reshape(-1))
        opt.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        rates = [r["underflow_rate"] for r in scaler.layer_scales() if r["underflow_rate"] is not None]
        if rates:
            underflow.append(sum(rates) / len(rates))
        loss_grad = scaler.loss_grad_stats()  # steps with statistics only
        if loss_grad is not None:
            loss_underflow.append(loss_grad["underflow_rate"])
    model.eval()
    with torch.no_grad():
        if model_name == "cnn":
            metric = (model(xte).argmax(1) == yte).float().mean().item()
        else:
            seq = torch.stack([data[j:j + 65] for j in range(split, len(data) - 65, 97)])
            metric = F.cross_entropy(model(seq[:, :-1]).reshape(-1, len(chars)), seq[:, 1:].reshape(-1)).item()
    mean = lambda v: sum(v) / max(1, len(v))  # noqa: E731
    return metric, source, scaler, mean(underflow), mean(loss_underflow), time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["cnn", "charlm"], default="cnn")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grad-formats", default="fp8_e5m2,fp8_e4m3")
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    torch.set_num_threads(1)
    metric_name = "test accuracy" if args.model == "cnn" else "test loss (nats/char)"
    print(f"| model | grad format | policy | {metric_name} | skipped | loss-gradient underflow | "
          "layers' underflow | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for gf in args.grad_formats.split(","):
        for name in args.policies.split(","):
            metric, source, scaler, uf, luf, secs = run(args.model, gf, POLICIES[name], args.steps, args.seed,
                                                        args.batch)
            print(f"| {args.model} ({source}) | {gf} | {name} | {metric:.4f} | {scaler.skipped_steps} | {luf:.2e} | "
                  f"{uf:.2e} | {secs:.0f} |", flush=True)


if __name__ == "__main__":
    main()
