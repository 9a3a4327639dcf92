"""Ordinary PyTorch training code around a Scaler: the model's parameters are its fp32 masters at every
moment the caller can see them, every backward pass is a pass of its own (several per step, one that
raised, nested ones), and GradScaler's contract holds (several optimizers, get_scale, sparse
gradients). Exactness is checked with fp32 storage and power-of-two scales, where every scaled
gradient must equal plain PyTorch's bit for bit."""
import copy
import io
import json
import os
import pickle

import pytest
import torch
from torch import nn
import torch.nn.functional as F
import torch.utils.checkpoint as checkpoint

from gradscale import _core
from gradscale.torch import Scaler

# Every GEMM layer multiplies its upstream gradient by 4, S0 = 8 (as in test_branches).
FIXED = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8,
         "scale_upper_bound": 16, "accum_upper_bound": 2 ** 40}


def mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def batch(n=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return x, (x[:, :4].argmax(dim=1))


def params_of(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def same(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


def representable(t, fmt):
    q = t.detach().clone().contiguous()
    _core.quantize_(q.data_ptr(), q.numel(), fmt)
    return torch.equal(q, t)


def grads_equal(model, ref):
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert p.grad is not None and torch.equal(p.grad, q.grad), f"{n} differs from PyTorch's fp32 gradient"


# ---- the parameters are the masters --------------------------------------------------------------
def test_parameters_are_the_masters_inside_hooks_and_after_any_forward():
    model = mlp()
    Scaler(model, scaler="static:1024", format="fp8_e4m3")
    masters = params_of(model)
    seen = []
    model[2].register_forward_hook(lambda m, i, o: seen.append(m.weight.detach().clone()))
    x, _ = batch()
    model(x)  # a validation forward without torch.no_grad()
    with torch.no_grad():
        model(x)
    model.eval()
    model(x)
    assert all(torch.equal(w, masters["2.weight"]) for w in seen)
    assert same(params_of(model), masters)
    assert all(type(p) is nn.Parameter for p in model.parameters())
    state = model.state_dict()
    assert all(torch.equal(state[n], masters[n]) for n in masters)
    assert not representable(masters["2.weight"], "fp8_e4m3")  # else the check above could not fail


class Probe(nn.Linear):
    def forward(self, x):  # noqa: A002
        self.working = self.weight.detach().clone()
        return super().forward(x)


def test_the_working_copy_exists_inside_the_layer_call_only():
    torch.manual_seed(0)
    model = nn.Sequential(Probe(16, 8), nn.ReLU(), nn.Linear(8, 4))
    Scaler(model, scaler="static:1", format="fp8_e4m3")
    master = model[0].weight.detach().clone()
    model(batch()[0])
    assert representable(model[0].working, "fp8_e4m3") and not torch.equal(model[0].working, master)
    assert torch.equal(model[0].weight.detach(), master)


def test_a_forward_between_backward_and_step_loses_no_update():
    x, y = batch()
    results = []
    for extra_forward in (False, True):
        model = mlp()
        scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16")
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            if extra_forward:
                (model(x).argmax(1) == y).float().mean()  # logging accuracy, grad enabled
            assert scaler.step(opt)
            scaler.update()
        results.append(params_of(model))
    assert same(results[0], results[1])
    assert not same(results[0], params_of(mlp()))


# ---- a backward pass that raises -----------------------------------------------------------------
@pytest.mark.parametrize("error", [ValueError, KeyboardInterrupt])
def test_an_exception_in_backward_skips_the_step_and_leaves_everything_usable(error):
    model = mlp()
    scaler = Scaler(model, scaler="torch", format="fp8_e4m3", grad_format="fp8_e5m2")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    masters = params_of(model)
    fail = [True]

    def hook(grad):
        if fail[0]:
            raise error("a user's hook failed")
        return grad

    out = model(x)
    out.register_hook(hook)
    with pytest.raises(error):
        scaler.scale(F.cross_entropy(out, y)).backward()
    assert same(params_of(model), masters)  # the model holds its masters
    assert scaler.step(opt) is False  # the step is the failed pass's: skipped, with its reason
    assert "raised" in scaler.last_step["reason"]
    scaler.update()
    assert same(params_of(model), masters)
    scale = scaler.get_scale()
    fail[0] = False
    for _ in range(2):  # the scaler is usable: the next steps train
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        assert scaler.step(opt)
        scaler.update()
    assert scaler.get_scale() == scale  # a failed pass is no overflow: no back-off
    assert not same(params_of(model), masters)


def test_a_failed_pass_does_not_poison_the_next_step_and_the_scaler_keeps_counting():
    model = mlp()
    scaler = Scaler(model, scaler="static:4", format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    out = model(x)
    out.register_hook(lambda g: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        scaler.scale(F.cross_entropy(out, y)).backward()
    # Straight to the next iteration without step()/update(): scale() closes nothing silently; the
    # failed pass's step still ends skipped at step().
    opt.zero_grad()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    assert scaler.step(opt) is False
    scaler.update()
    assert scaler.skipped_steps == 1
    opt.zero_grad()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    assert scaler.step(opt) is True
    scaler.update()


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
        else:
            h = self.segment(h)
        return self.head(torch.relu(h))


def _inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)


@pytest.mark.parametrize("how", ["reentrant", "non_reentrant"])
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

    def penalised(net, scale):
        xin = x.clone().requires_grad_()
        out = net(xin)
        grad, = torch.autograd.grad(scale(F.cross_entropy(out, y)), xin, create_graph=True)
        return F.cross_entropy(out, y) + grad.pow(2).sum()

    penalised(ref, lambda l: l).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    loss = penalised(model, scaler.scale)
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


# ---- clear errors --------------------------------------------------------------------------------
def test_construction_validates_its_arguments():
    with pytest.raises(TypeError, match="format="):
        Scaler(mlp(), format=16)
    with pytest.raises(TypeError, match="grad_format="):
        Scaler(mlp(), grad_format=8)
    with pytest.raises(TypeError, match="scaler="):
        Scaler(mlp(), scaler=1024)
    with pytest.raises(ValueError, match="element_wise"):
        Scaler(mlp(), scaler={"policy": "adaptive", "method": "element_wise"})
    with pytest.raises(ValueError, match="record_every"):
        Scaler(mlp(), record_every=True)
    with pytest.raises(ValueError, match="trace_hist"):
        Scaler(mlp(), trace="t", trace_hist="yes")


def test_trace_paths_are_checked(tmp_path):
    for bad in (str(tmp_path) + os.sep, ".", str(tmp_path)):
        with pytest.raises(ValueError, match="must name a file"):
            Scaler(mlp(), trace=bad)
    config = tmp_path / "config.json"
    config.write_text('{"mine": 1}')
    with pytest.raises(ValueError, match="not a gradscale trace"):
        Scaler(mlp(), trace=str(tmp_path / "config"))
    assert json.loads(config.read_text()) == {"mine": 1}


def test_load_state_dict_refuses_other_shapes_and_counts():
    a = Scaler(mlp(), format="fp16")
    state = a.state_dict()
    wide = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4))
    with pytest.raises(ValueError, match="other parameter shapes"):
        Scaler(wide, format="fp16").load_state_dict(state)
    with pytest.raises(ValueError, match="skipped_steps"):
        Scaler(mlp(), format="fp16").load_state_dict(dict(state, skipped_steps=-3))


def test_close_after_a_nan_loss_writes_the_trace(tmp_path):
    model = mlp()
    scaler = Scaler(model, scaler="torch", format="fp16", trace=str(tmp_path / "run"), trace_every=1)
    x, y = batch()
    loss = F.cross_entropy(model(x), y) * float("nan")
    scaler.scale(loss).backward()
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1)) is False
    scaler.update()
    scaler.close()
    summary = json.loads((tmp_path / "run.json").read_text())["summary"]
    assert summary["train_loss"] is None and summary["skipped"] == 1


def test_an_empty_last_batch_is_no_internal_error():
    model = mlp()
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    masters = params_of(model)
    scaler.scale(F.cross_entropy(model(x[:0]), y[:0])).backward()  # the mean of nothing: NaN
    # Its gradients are zeros, all finite: the step applies, as GradScaler's would, and moves nothing.
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters())
    assert scaler.step(opt) is True
    scaler.update()
    assert same(params_of(model), masters)
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    assert scaler.step(opt) is True
    scaler.update()


def test_torch_compile_is_refused_with_a_message(monkeypatch):
    """torch 2.x: tracing under torch.compile gives tensors without memory; the Scaler says so at the
    first layer call (torch.compiler.is_compiling stands in for a real trace, which torch 1.13 lacks)."""
    import types
    model = mlp()
    Scaler(model, format="fp16")
    fake = types.SimpleNamespace(is_compiling=lambda: True)
    monkeypatch.setattr(torch, "compiler", fake, raising=False)
    with pytest.raises(RuntimeError, match="torch.compile"):
        model(batch()[0])
    assert all(type(p) is nn.Parameter for p in model.parameters())
