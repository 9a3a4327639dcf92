"""Ordinary PyTorch training code around a Scaler: clear errors (arguments, trace paths, state dicts of
other shapes, torch.compile), a trace written on close after a NaN loss, and an empty last batch."""
import json
import os

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale.torch import Scaler
from training_patterns_common import batch, mlp, params_of, same


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


def test_torch_jit_trace_is_refused_with_a_message():
    # A trace records torch's operations only, not the core's roundings: the traced model computed
    # something else (without check_trace) or failed with "Graphs differed across invocations".
    model = mlp()
    Scaler(model, format="fp16")
    for check in (True, False):
        with pytest.raises(RuntimeError, match="torch.jit.trace"):
            torch.jit.trace(model, batch()[0], check_trace=check)
    assert all(type(p) is nn.Parameter for p in model.parameters())


def test_torch_jit_script_is_refused_with_a_message_and_works_after_remove():
    model = mlp()
    scaler = Scaler(model, format="fp16")
    with pytest.raises(RuntimeError, match="torch.jit.script"):
        torch.jit.script(model)
    scaler.remove()
    x = batch()[0]
    assert torch.equal(torch.jit.script(model)(x), model(x))


def test_a_forward_under_inference_mode_is_a_forward_under_no_grad():
    # Inference tensors have no version counter: the note that an output is already rounded read it.
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    scaler = Scaler(model, scaler="torch", format="fp16")
    x, y = batch()
    with torch.no_grad():
        expected = model(x)
    with torch.inference_mode():
        got = model(x)
    assert torch.equal(got, expected)
    scaler.scale(F.cross_entropy(model(x), y)).backward()  # training goes on
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1)) is True


@pytest.mark.parametrize("fmt", ["bf16", "fp32"])
def test_steps_apply_again_after_nan_losses_with_wide_formats(fmt):
    # bf16's and fp32's u_max is near float32's largest value: after two skipped steps S_in is below 1,
    # and the weight-gradient factor r was allowed up to 2^126 / S_in, past 2^127 — infinite as the
    # float the product is multiplied by, so every later step overflowed and was skipped.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(5, 8), torch.randn(5, 4)
    applied = []
    for step in range(8):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        if step < 2:
            loss = loss * float("nan")
        scaler.scale(loss).backward()
        applied.append(scaler.step(opt))
        scaler.update()
        assert all(r["weight_grad_scale"] <= 2.0 ** 127 for r in scaler.layer_scales())
    assert applied == [False, False] + [True] * 6
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_refused_state_dict_mid_step_leaves_the_step_to_finish():
    # A state the core refuses, loaded between backward and step: refused with the call's name, and the
    # step in progress goes on (its update applied) as if nothing had been tried.
    torch.manual_seed(0)
    model, ref = mlp(), mlp()
    ref.load_state_dict(model.state_dict())
    scaler, ref_scaler = Scaler(model, scaler="static:8", format="fp32"), Scaler(ref, scaler="static:8", format="fp32")
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    bad = scaler.state_dict()
    bad["core"]["steps"] = -1
    nan = scaler.state_dict()
    nan["core"]["scaler"]["state"]["phi"] = float("nan")
    x, y = batch()
    for s, m in ((scaler, model), (ref_scaler, ref)):
        s.scale(F.cross_entropy(m(x), y)).backward()
    with pytest.raises(ValueError, match="load_state_dict: scaler state: 'steps'"):
        scaler.load_state_dict(bad)
    with pytest.raises(ValueError, match="load_state_dict: .*not what Scaler.state_dict"):
        scaler.load_state_dict(nan)
    assert scaler.step(opt) is True and ref_scaler.step(ref_opt) is True
    scaler.update()
    ref_scaler.update()
    assert same(params_of(model), params_of(ref))
    scaler.scale(F.cross_entropy(model(x), y)).backward()  # and the next step starts as usual
    assert scaler.step(opt) is True


def test_misused_arguments_are_named_before_anything_changes():
    # layers= as one string was read letter by letter; process_group= took anything; step() with no
    # optimizer consumed the step's verdict before failing; a removed Scaler blamed the loss.
    with pytest.raises(TypeError, match=r"layers= takes a list .*layers=\['0'\]"):
        Scaler(mlp(), layers="0")
    with pytest.raises(TypeError, match="process_group="):
        Scaler(mlp(), process_group=5)
    model = mlp()
    scaler = Scaler(model, scaler="static:8", format="fp32")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    with pytest.raises(TypeError, match="step\\(\\) takes the optimizer"):
        scaler.step("opt")
    assert scaler.step(opt) is True  # the verdict is still to take
    scaler.update()
    scaler.remove()
    with pytest.raises(RuntimeError, match="after its remove"):
        scaler.scale(F.cross_entropy(model(x), y))


def test_two_models_with_a_scaler_each_in_one_loss_get_the_way_out():
    # A GAN's generator loss reads the discriminator's output: each model has its own Scaler.
    gen, disc = nn.Sequential(nn.Linear(4, 8)), nn.Sequential(nn.Linear(8, 1))
    sg = Scaler(gen, scaler="static:8", format="fp16")
    Scaler(disc, scaler="static:8", format="fp16")
    with pytest.raises(RuntimeError, match="one Scaler over a module whose forward runs both"):
        sg.scale(-disc(gen(torch.randn(6, 4))).mean()).backward()
    both = nn.ModuleDict({"g": nn.Sequential(nn.Linear(4, 8)), "d": nn.Sequential(nn.Linear(8, 1))})
    scaler = Scaler(both, scaler="static:8", format="fp16")
    with pytest.raises(ValueError, match="needs a module whose forward runs its parts"):
        scaler.scale(-both["d"](both["g"](torch.randn(6, 4))).mean())


def test_a_pre_hook_that_raises_leaves_no_open_call_behind():
    from gradscale.torch._boundary import CallWrapper
    model = mlp()
    Scaler(model, scaler="static:8", format="fp16")
    layer = model[0]
    wrapper = layer.__dict__["forward"]
    assert isinstance(wrapper, CallWrapper)

    def refuse(module, inputs):
        raise RuntimeError("a user's pre-hook")
    handle = layer.register_forward_pre_hook(refuse)
    for _ in range(3):
        with pytest.raises(RuntimeError, match="a user's pre-hook"):
            model(batch()[0])
    handle.remove()
    model(batch()[0])
    assert wrapper.calls == []
