"""Ordinary PyTorch training code around a Scaler: every backward pass is a pass of its own, several per
step and nested ones (activation checkpointing, two losses over a retained graph, a gradient penalty,
an abandoned scale). Exactness is checked with fp32 storage and power-of-two scales, where every scaled
gradient must equal plain PyTorch's bit for bit."""
import copy

import pytest
import torch
from torch import nn
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

from gradscale.torch import Scaler
from training_patterns_common import FIXED, batch, mlp, penalised_loss


def grads_equal(model, ref):
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), f"{n} differs from PyTorch's fp32 gradient"


# ---- several passes, nested passes ---------------------------------------------------------------
class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.c = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def segment(self, h):
        return h + self.c(torch.relu(self.b(h)))  # a join inside the segment

    def forward(self, x, how=None):
        h = torch.tanh(self.a(x))
        if how == "reentrant":
            h = checkpoint.checkpoint(self.segment, h, use_reentrant=True)
        elif how == "non_reentrant":
            h = checkpoint.checkpoint(self.segment, h, use_reentrant=False)
        elif how == "reentrant_nested":  # the inner checkpoint's output is the outer segment's output
            h = checkpoint.checkpoint(lambda t: checkpoint.checkpoint(self.segment, t, use_reentrant=True), h,
                                      use_reentrant=True)
        else:
            h = self.segment(h)
        return self.head(torch.relu(h))


def _inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant", "reentrant_nested"])
def test_activation_checkpointing_gives_pytorchs_gradients(how):
    torch.manual_seed(1)
    model = Residual()
    ref = copy.deepcopy(model)
    x, y = _inputs()
    F.cross_entropy(ref(x), y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    scaler.scale(F.cross_entropy(model(x, how), y)).backward()
    grads_equal(model, ref)
    rows = {r["name"]: r for r in scaler.layer_scales()}
    assert rows["b"]["S_in"] > 8  # the segment's layers ran at scales of their own
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant"])
def test_activation_checkpointing_trains_in_fp16(how):
    torch.manual_seed(1)
    model = Residual()
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16",
                    grad_format="fp8_e5m2")
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    x, y = _inputs()
    losses = []
    for _ in range(20):
        opt.zero_grad()
        loss = F.cross_entropy(model(x, how), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_two_losses_over_a_retained_graph():
    torch.manual_seed(1)
    model = Residual()
    ref = copy.deepcopy(model)
    x, y = _inputs()
    out = ref(x)
    F.cross_entropy(out, y).backward(retain_graph=True)
    (out ** 2).mean().backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    out = model(x)
    scaler.scale(F.cross_entropy(out, y)).backward(retain_graph=True)
    scaler.scale((out ** 2).mean()).backward()
    grads_equal(model, ref)
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()
    assert scaler.last_step["loss"] == pytest.approx(F.cross_entropy(out, y).item() + (out ** 2).mean().item())


def test_a_second_backward_over_a_retained_graph_needs_its_own_scale():
    model = mlp()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    x, y = batch()
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward(retain_graph=True)
    grads = [p.grad.clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="scaler.scale"):
        loss.backward()
    # Refused before it reached the model: the first pass's gradients stand, and its step applies.
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()


def test_a_gradient_penalty_keeps_its_graph_and_is_exact():
    torch.manual_seed(1)
    model = Residual()
    ref = copy.deepcopy(model)
    x, y = _inputs()

    penalised_loss(ref, lambda l: l, x, y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    loss = penalised_loss(model, scaler.scale, x, y)
    scaler.scale(loss).backward()
    grads_equal(model, ref)
    # Without the penalty's graph, the gradients would differ (the check above can fail).
    plain = copy.deepcopy(ref)
    plain.zero_grad()
    F.cross_entropy(plain(x), y).backward()
    assert not torch.equal(plain.a.weight.grad, ref.a.weight.grad)
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()


def test_an_abandoned_scale_adds_nothing_to_the_reported_loss():
    model = mlp()
    scaler = Scaler(model, scaler="static:8", format="fp16")
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x) * 3, y))  # never backpropagated
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()
    assert scaler.last_step["loss"] == pytest.approx(loss.item())


