"""Ordinary PyTorch training code around a Scaler: GradScaler's contract holds (several optimizers, each
skipped on its own, sparse gradients, one scaler per model, dtype changes and pickling refused clearly,
the state dict saved)."""
import copy
import io
import pickle

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale.torch import Scaler
from training_patterns_common import FIXED, batch, mlp, params_of, same


# ---- GradScaler's contract -----------------------------------------------------------------------
def test_two_optimizers_step_in_one_step():
    model = mlp()
    ref = copy.deepcopy(model)
    x, y = batch()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.Adam(list(model[2].parameters()) +
                                                                             list(model[4].parameters()), lr=0.01)]
    ref_opts = [torch.optim.SGD(ref[0].parameters(), lr=0.1), torch.optim.Adam(list(ref[2].parameters()) +
                                                                               list(ref[4].parameters()), lr=0.01)]
    for _ in range(3):
        for o, r in zip(opts, ref_opts):
            o.zero_grad()
            r.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        F.cross_entropy(ref(x), y).backward()
        assert scaler.step(opts[0]) and scaler.step(opts[1])
        with pytest.raises(RuntimeError, match="already been called"):
            scaler.step(opts[0])
        scaler.update()
        for r in ref_opts:
            r.step()
    assert same(params_of(model), params_of(ref))


class TwoBranches(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)

        with torch.no_grad():
            self.b.weight.mul_(1e-4)

    def forward(self, x):
        # b's input is large and its weight small: its output is moderate, its weight gradient x^T g
        # passes 65504 at S0 = 2^16 while a's stays finite.
        return self.a(x) + self.b(x * 1e4)


def test_each_optimizer_is_skipped_on_its_own_as_gradscaler_does():
    torch.manual_seed(0)
    model = TwoBranches()
    scaler = Scaler(model, scaler="torch", format="fp16")
    opt_a = torch.optim.SGD(model.a.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(model.b.parameters(), lr=0.1)
    before = params_of(model)
    x = torch.randn(8, 4)
    scaler.scale(model(x).pow(2).mean()).backward()
    assert torch.isfinite(model.a.weight.grad).all() and not torch.isfinite(model.b.weight.grad).all()
    assert scaler.step(opt_a) is True  # its gradients are finite and none of its layers overflowed
    assert scaler.step(opt_b) is False
    assert scaler.get_scale() == 65536  # GradScaler: the scale changes at update()
    scaler.update()
    assert scaler.get_scale() == 32768
    after = params_of(model)
    assert not torch.equal(after["a.weight"], before["a.weight"])
    assert torch.equal(after["b.weight"], before["b.weight"])
    # One optimizer over both: skipped as a whole.
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.zero_grad()
    scaler.scale(model(x * 4).pow(2).mean()).backward()
    assert scaler.step(opt) is False
    scaler.update()


def test_sparse_embedding_gradients():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 6, sparse=True), nn.Flatten(), nn.Linear(18, 3))
    ref = copy.deepcopy(model)
    idx = torch.randint(0, 20, (5, 3))
    y = torch.randint(0, 3, (5,))
    F.cross_entropy(ref(idx), y).backward()
    for fmt in ("fp32", "fp16"):
        m = copy.deepcopy(ref)
        m.zero_grad(set_to_none=True)
        scaler = Scaler(m, scaler=FIXED, format=fmt)
        scaler.scale(F.cross_entropy(m(idx), y)).backward()
        assert m[0].weight.grad.is_sparse
        if fmt == "fp32":
            assert torch.equal(m[0].weight.grad.to_dense(), ref[0].weight.grad.to_dense())
        assert scaler.step(torch.optim.SGD(m.parameters(), lr=0.1))
        scaler.update()


@pytest.mark.parametrize("change", ["half", "double"])
def test_a_dtype_change_after_the_scaler_is_refused_clearly(change):
    model = mlp()
    Scaler(model, format="fp16")
    getattr(model, change)()
    with pytest.raises(TypeError, match="float32 masters"):
        model(batch()[0])
    assert all(type(p) is nn.Parameter for p in model.parameters())


def test_a_refused_call_leaves_no_call_open():
    """The dtype check fails after the call's pre-hook opened it: the call is closed, so the layer's
    wrapper holds no open call (its stack pairs the calls of a module that calls itself), and the model
    trains once its dtype is put back."""
    model = mlp()
    scaler = Scaler(model, format="fp16")
    model.double()
    with pytest.raises(TypeError, match="float32 masters"):
        model(batch()[0])
    assert all(m.forward.calls == [] for m in model if isinstance(m, nn.Linear))
    model.float()
    x, y = batch()
    scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))


def test_one_scaler_per_model():
    model = mlp()
    first = Scaler(model, format="fp16")
    with pytest.raises(ValueError, match="already has a gradscale Scaler"):
        Scaler(model, format="fp16")
    twin = copy.deepcopy(model)  # the copy is scaled by a copy of the first Scaler...
    copied = next(iter(twin[0]._forward_pre_hooks.values())).__self__.scaler
    assert copied is not first
    fresh = Scaler(twin, format="bf16")  # ...which a Scaler made for the copy replaces
    assert not twin[0]._forward_pre_hooks or \
        all(h.__self__.scaler is fresh for h in twin[0]._forward_pre_hooks.values())
    first.remove()
    second = Scaler(model, format="bf16")  # after remove() a new one may attach
    x, y = batch()
    second.scale(F.cross_entropy(model(x), y)).backward()
    assert second.step(torch.optim.SGD(model.parameters(), lr=0.1))
    second.update()


def test_pickling_a_scaled_model_is_refused_clearly_and_its_state_dict_saves():
    model = mlp()
    scaler = Scaler(model, format="fp16")
    with pytest.raises(TypeError, match="state_dict"):
        torch.save(model, io.BytesIO())
    with pytest.raises(TypeError, match="state_dict"):
        pickle.dumps(scaler)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "scaler": scaler.state_dict()}, buf)
    scaler.remove()
    torch.save(model, io.BytesIO())  # detached: an ordinary module again


