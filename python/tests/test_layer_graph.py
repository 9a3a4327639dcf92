"""The layer graph the plug-in learns from autograd (LayerInfo::inputs of the C++ core), and SPEC §6.5's
charging along it: an overflow at a place that is no controlled layer's own is charged to the φ_l of
the controlled layer that set the scale the place received, as in gradscale's own engine — not to the
loss scale's φ."""
import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale.torch import Scaler

from test_branches import CASES, FIXED, _inputs


class Amplify(torch.autograd.Function):
    """The identity forward; backward multiplies the gradient by 2^20 (a functional op of the model)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return g * 2.0 ** 20


class Overflowing(nn.Module):
    """a → (an fp32 op that blows its gradient up) → head. In backward, `a`'s output receives the
    gradient `head` sent at its scale s·S0, times 2^20: it overflows fp16 where `a` rounds it."""

    def __init__(self, head_first: bool):
        super().__init__()
        if head_first:  # the layer table (module order) is then not the data flow's order
            self.head = nn.Linear(8, 3)
            self.a = nn.Linear(6, 8)
        else:
            self.a = nn.Linear(6, 8)
            self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(Amplify.apply(self.a(x)))


def _phis(scaler):
    state = scaler.state_dict()["core"]["scaler"]["state"]
    names = [r["name"] for r in scaler.layer_scales()]
    return state["phi"], {names[l["id"]]: l.get("phi", 1.0) for l in state["layers"]}


@pytest.mark.parametrize("head_first", [False, True])
def test_an_overflow_at_no_layers_own_place_is_charged_to_the_layer_that_set_its_scale(head_first):
    torch.manual_seed(0)
    model = Overflowing(head_first)
    x, y = torch.randn(16, 6), torch.randint(0, 3, (16,))
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8},
                    format="fp16")
    names = [r["name"] for r in scaler.layer_scales()]
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()
    assert scaler.last_step["found_inf"] and scaler.last_step["first_nonfinite_layer"] == "a"
    inputs = scaler._core.layer_inputs()
    assert inputs[names.index("head")] == [names.index("a")] and inputs[names.index("a")] == []
    loss_phi, layer_phi = _phis(scaler)
    # head's s set the scale a's output received (s·S0 = 32, then ×2^20 by a functional op): head pays.
    assert loss_phi == 1.0
    assert layer_phi.get("head", 1.0) < 1.0 and layer_phi.get("a", 1.0) == 1.0
    # The next step: head's s is backed off by its φ_l, S0 is not.
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    rows = {r["name"]: r for r in scaler.layer_scales()}
    assert scaler.get_scale() == 8 and rows["head"]["s"] == 4 * layer_phi["head"]


def test_the_layer_graph_follows_the_data_flow():
    """Inputs of each layer on the branch topologies: functional ops, joins and shortcuts are walked
    through; a module called twice reads itself; the model's input is not listed."""
    expected = {"residual": {"a": [], "b": ["a"], "head": ["a", "b"]},
                "called_twice": {"a": [], "shared": ["a", "shared"], "head": ["shared"]},
                "read_twice": {"a": [], "b": ["a"], "c": ["a"], "head": ["a", "b", "c"]},
                "tied": {"emb": [], "mid": ["emb"], "out": ["mid"]}}
    for name, want in expected.items():
        torch.manual_seed(1)
        model = CASES[name]()
        x, y = _inputs(name)
        scaler = Scaler(model, scaler=FIXED, format="fp32")
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        names = [r["name"] for r in scaler.layer_scales()]
        got = {names[i]: [names[j] if j >= 0 else -1 for j in ids]
               for i, ids in enumerate(scaler._core.layer_inputs())}
        assert got == want, name
