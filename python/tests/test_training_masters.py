"""Ordinary PyTorch training code around a Scaler: the model's parameters are its fp32 masters at every
moment the caller can see them (in hooks, after any forward, between backward and step), and a backward
pass that raises skips the step and leaves the model and the scaler usable."""
import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale import _core
from gradscale.torch import Scaler
from training_patterns_common import batch, mlp, params_of, same


def representable(t, fmt):
    q = t.detach().clone().contiguous()
    _core.quantize_(q.data_ptr(), q.numel(), fmt)
    return torch.equal(q, t)


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


