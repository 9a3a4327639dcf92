"""The plug-in under the adaptive policy's "bounds": "derived" (docs/scalers.md, "Bounds"): the core's rule, so
a conv whose gradient passes through a BatchNorm sends at most u_max·2^-margin over the magnitude that
BatchNorm sent the step before (the state's downstream_max), and no constant holds the scales."""
import copy
import math

import torch
from torch import nn

from gradscale.torch import Scaler

U_MAX_E5M2 = 57344.0


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))


def _train(bounds, steps=4):
    net = copy.deepcopy(_net())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    scaler = Scaler(net, scaler={"policy": "adaptive", "method": "measured", "init_scale": "auto",
                                 "cast_form": "measured", "bounds": bounds}, format="fp16", grad_format="fp8_e5m2")
    torch.manual_seed(1)
    x, y = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    seen = []  # per step: (downstream_max of the second conv before the step, its S_out in the step)
    for _ in range(steps):
        state = scaler.state_dict()["core"]
        conv = state["layers"].index("3")
        before = {l["id"]: l.get("downstream_max", 0.0) for l in state["scaler"]["state"]["layers"]}
        opt.zero_grad()
        scaler.scale(nn.functional.cross_entropy(net(x), y)).backward()
        assert scaler.step(opt)
        scaler.update()
        s_out = {r["name"]: r["S_out"] for r in scaler.layer_scales()}["3"]
        seen.append((before.get(conv, 0.0), s_out))
    return scaler, seen


def test_derived_bounds_hold_the_scale_behind_a_batchnorm_to_the_rule():
    scaler, seen = _train("derived")
    assert scaler.state_dict()["core"]["scaler"]["config"]["bounds"] == "derived"
    measured = [(d, s) for d, s in seen if d > 0]
    assert measured, seen  # the BatchNorm's magnitude is known from the second step on
    for d, s_out in measured:
        assert s_out <= math.ldexp(U_MAX_E5M2, -4) / d
    # No constant: the reference holds every layer's s at 16 here; the derived bound lets it go higher.
    _, reference = _train("reference")
    assert max(s for _, s in reference) <= 16
    assert max(s for _, s in seen) > 16
