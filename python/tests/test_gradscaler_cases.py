"""PyTorch's own GradScaler test cases (its test suite's grad-scaling tests), re-expressed for the
plug-in. Each trains a scaled model next to a control that runs plain fp32 PyTorch and skips the same
iteration by hand; with fp32 storage and power-of-two per-layer scales the two must agree bit for bit.

Cases of that suite that do not apply, and why:
- unscaling a list of gradients in place (`_amp_foreach_non_finite_check_and_unscale_`): the plug-in
  divides each weight-gradient part by its own scale inside backward; `unscale_` only marks the
  optimizer. `test_unscale_marks_and_leaves_true_gradients` checks that contract instead.
- several GPUs in one process, per-device state ("multigpu", "device_as_key"): a Scaler works on one
  device; several devices are several processes (python/tests/test_distributed.py).
- `scale()` of nested lists of outputs: S0 enters where the model's outputs are read, so `scale()`
  takes the scalar loss; several outputs of one model are covered by `test_multiple_models_losses_and_optimizers`.
- `GradScaler(enabled=False)` and `update(new_scale)`: the scales belong to the policy (`"none"` is the
  disabled scaler; `update(new_scale)` is refused, test_scaler.py).
- Under autocast: test_device.py (the layers compute in float32 on values of `format`, the ops between
  them keep autocast's dtype).
"""
import copy

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale.torch import Scaler

FIXED = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8,
         "scale_upper_bound": 16, "accum_upper_bound": 2 ** 40}


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))


def data(n=4, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 8, generator=g), torch.randn(16, 8, generator=g)) for _ in range(n)]


def run_scaling_case(run, skip_iter=2, optimizer=torch.optim.SGD):
    """`run(data, model, optimizer, scaler or None, skip)` twice: scaled (the skipped iteration's loss is
    made infinite, so its gradients overflow) and a plain fp32 control that skips that step by hand.
    Returns the two models and the scaler."""
    models = []
    scaler = None
    for scaled in (True, False):
        model = make_model()
        opt = optimizer(model.parameters(), lr=0.1)
        s = Scaler(model, scaler=FIXED, format="fp32") if scaled else None
        run(data(), model, opt, s, skip_iter)
        models.append(model)
        scaler = s or scaler
    for (n, p), (_, q) in zip(models[0].named_parameters(), models[1].named_parameters()):
        assert torch.equal(p, q), f"{n} differs from the control"
    assert scaler.skipped_steps == (1 if skip_iter is not None else 0)
    return models[0], models[1], scaler


def loss_of(model, x, y, i, skip):
    loss = F.mse_loss(model(x), y)
    return loss * float("inf") if i == skip else loss


def test_unscale_marks_and_leaves_true_gradients():
    model = make_model()
    ref = copy.deepcopy(model)
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = data(1)[0]
    F.mse_loss(ref(x), y).backward()
    scaler.scale(F.mse_loss(model(x), y)).backward()
    before = [p.grad.clone() for p in model.parameters()]
    scaler.unscale_(opt)
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))
    with pytest.raises(RuntimeError, match="already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="after step"):
        scaler.unscale_(opt)
    scaler.update()


def test_update_sequence_of_the_torch_policy():
    """GradScaler's update rule (_amp_update_scale_): an overflow backs off and resets the tracker,
    `growth_interval` clean steps in a row grow the scale."""
    model = make_model()
    scaler = Scaler(model, scaler={"policy": "torch", "init_scale": 128.0, "growth_interval": 2}, format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = data(1)[0]
    overflow = [False, True, False, False, False, True, True, False, False]
    scale, tracker, expected = 128.0, 0, []
    for bad in overflow:
        if bad:
            scale, tracker = scale * 0.5, 0
        else:
            tracker += 1
            if tracker == 2:
                scale, tracker = scale * 2.0, 0
        expected.append(scale)
    seen = []
    for bad in overflow:
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        scaler.scale(loss * float("inf") if bad else loss).backward()
        assert scaler.step(opt) is (not bad)
        scaler.update()
        seen.append(scaler.get_scale())
    assert seen == expected


def test_the_scale_backs_off_until_nothing_overflows():
    """GradScaler's "will not overflow": a loss whose gradients overflow fp16 at 2^16 skips steps until
    the scale is small enough, then trains."""
    model = make_model()
    scaler = Scaler(model, scaler="torch", format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x, y = data(1)[0]
    applied = []
    for _ in range(24):
        opt.zero_grad()
        scaler.scale(F.mse_loss(model(x) * 100, y)).backward()
        applied.append(scaler.step(opt))
        scaler.update()
    first = applied.index(True)
    assert first >= 1 and all(applied[first:])
    assert scaler.get_scale() == 2.0 ** (16 - first)


@pytest.mark.parametrize("skip_iter", [None, 2])
def test_plain_training_matches_the_control(skip_iter):
    def run(data, model, opt, scaler, skip):
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = loss_of(model, x, y, i, skip)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                if i != skip:
                    opt.step()
    run_scaling_case(run, skip_iter)


@pytest.mark.parametrize("separate_unscale", [False, True])
def test_clipping(separate_unscale):
    max_norm = 0.2  # small enough that clipping bites

    def run(data, model, opt, scaler, skip):
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = loss_of(model, x, y, i, skip)
            if scaler is not None:
                scaler.scale(loss).backward()
                if separate_unscale:
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)  # .grad is true already
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
                if i != skip:
                    opt.step()
    run_scaling_case(run)


def test_gradient_penalty_on_the_parameters():
    """PyTorch's recipe differentiates scaler.scale(loss) and divides the result by get_scale(): with
    the plug-in the gradients autograd.grad returns are true already — dividing would be wrong by S0."""
    def run(data, model, opt, scaler, skip):
        for i, (x, y) in enumerate(data):
            opt.zero_grad()
            loss = loss_of(model, x, y, i, skip)
            scaled = scaler.scale(loss) if scaler is not None else loss
            grads = torch.autograd.grad(scaled, list(model.parameters()), create_graph=True)
            penalty = sum(g.pow(2).sum() for g in grads).sqrt()
            loss = loss + penalty
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                if i != skip:
                    opt.step()
    run_scaling_case(run)


def test_accumulation():
    iters_to_accumulate = 2

    def run(data, model, opt, scaler, skip):
        for i, (x, y) in enumerate(data):
            loss = loss_of(model, x, y, i, skip) / iters_to_accumulate
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
            if (i + 1) % iters_to_accumulate == 0:
                if scaler is not None:
                    scaler.step(opt)
                    scaler.update()
                elif i != skip and i - 1 != skip:
                    opt.step()
                opt.zero_grad()
    run_scaling_case(run, skip_iter=2)


class TwoModels(nn.Module):
    """PyTorch's "multiple models": one Scaler per model, so the two are parts of one module."""

    def __init__(self):
        super().__init__()
        self.model0 = make_model()
        torch.manual_seed(1)
        self.model1 = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))

    def forward(self, x):
        return self.model0(x), self.model1(x)


def test_multiple_models_losses_and_optimizers():
    results = []
    for scaled in (True, False):
        net = TwoModels()
        opt0 = torch.optim.SGD(net.model0.parameters(), lr=0.1)
        opt1 = torch.optim.Adam(net.model1.parameters(), lr=0.01)
        scaler = Scaler(net, scaler=FIXED, format="fp32") if scaled else None
        for i, (x, y) in enumerate(data()):
            opt0.zero_grad()
            opt1.zero_grad()
            out0, out1 = net(x)
            loss0 = F.mse_loss(0.3 * out0 + 0.7 * out1, y)
            loss1 = F.mse_loss(0.6 * out0 - 0.4 * out1, y)
            if i == 2:
                loss1 = loss1 * float("inf")
            if scaled:
                scaler.scale(loss0).backward(retain_graph=True)
                scaler.scale(loss1).backward()
                scaler.unscale_(opt0)  # as PyTorch's test: one optimizer unscaled separately
                scaler.step(opt0)
                scaler.step(opt1)
                scaler.update()
            else:
                loss0.backward(retain_graph=True)
                loss1.backward()
                if i != 2:
                    opt0.step()
                    opt1.step()
        results.append(net)
    for (n, p), (_, q) in zip(results[0].named_parameters(), results[1].named_parameters()):
        assert torch.equal(p, q), n


def test_sparse_gradients_with_repeated_indices():
    """PyTorch's "unscale sparse": a sparse gradient with repeated indices is coalesced (summed) before
    it is rounded and unscaled, like a dense one."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Flatten(), nn.Linear(12, 2))
    ref = copy.deepcopy(model)
    idx = torch.tensor([[1, 1, 2], [2, 1, 1]])  # repeated rows
    y = torch.randn(2, 2)
    F.mse_loss(ref(idx), y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    scaler.scale(F.mse_loss(model(idx), y)).backward()
    grad = model[0].weight.grad
    assert grad.is_sparse and torch.equal(grad.to_dense(), ref[0].weight.grad.to_dense())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert scaler.step(opt)
    scaler.update()
    # An infinite sparse gradient is found and skips the step.
    opt.zero_grad()
    scaler.scale(F.mse_loss(model(idx), y) * float("inf")).backward()
    assert scaler.step(opt) is False
    scaler.update()


def test_state_dict_between_scalers():
    """PyTorch's state_dict test: a Scaler loaded from another's state continues its sequence."""
    a_model, b_model = make_model(), make_model()
    policy = {"policy": "torch", "init_scale": 64.0, "growth_interval": 3}
    a = Scaler(a_model, scaler=policy, format="fp16")
    b = Scaler(b_model, scaler=policy, format="fp16")
    x, y = data(1)[0]
    for step in range(4):  # 64, overflow -> 32, then two clean steps of three
        a_model.zero_grad()
        loss = F.mse_loss(a_model(x), y)
        a.scale(loss * float("inf") if step == 1 else loss).backward()
        a.step(torch.optim.SGD(a_model.parameters(), lr=0.0))
        a.update()
    b.load_state_dict(a.state_dict())
    assert b.get_scale() == a.get_scale() == 32.0
    for scaler, model in ((a, a_model), (b, b_model)):
        model.zero_grad()
        loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(torch.optim.SGD(model.parameters(), lr=0.0))
        scaler.update()
    assert a.get_scale() == b.get_scale() == 64.0  # the third clean step grows it
    assert a.state_dict()["core"] == b.state_dict()["core"]
