"""The forward copies at layer boundaries: a layer output the Scaler rounded, read untouched by a
torch.nn layer, is not rounded into a second copy (the same values, one pass and one tensor fewer); an
output changed in place since, or read by a layer of the user's own (which may write to its input),
gets its own rounded copy as before."""
import torch
from torch import nn

from gradscale import _core
from gradscale.torch import Scaler

FIXED = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8}


def representable(t, fmt):
    q = t.detach().clone().contiguous()
    _core.quantize_(q.data_ptr(), q.numel(), fmt)
    return torch.equal(q, t.detach().contiguous())


class OwnLayerNorm(nn.LayerNorm):
    """nn.LayerNorm's arithmetic in a class of the user's: the plug-in cannot know it reads only."""


class Stack(nn.Module):
    def __init__(self, norm=nn.LayerNorm, between=None):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(6, 8)
        self.norm = norm(8)
        self.fc2 = nn.Linear(8, 3)
        self.between = between

    def forward(self, x):
        h = self.fc1(x)
        if self.between is not None:
            h = self.between(h)
        return self.fc2(self.norm(h))


def seen(model):
    """fc1's output after the Scaler's hook and norm's input after the Scaler's pre-hook, per call."""
    got = {}
    model.fc1.register_forward_hook(lambda m, i, o: got.__setitem__("fc1_out", o))
    model.norm.register_forward_pre_hook(lambda m, i: got.__setitem__("norm_in", i[0]))
    return got


def step(model, scaler, x, y):
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    scaler.scale(loss).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    return out.detach(), grads


def test_an_output_read_untouched_by_a_torch_layer_is_not_rounded_twice():
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 6, generator=gen) * 3, torch.randint(0, 3, (5,), generator=gen)
    model, own = Stack(), Stack(norm=OwnLayerNorm)
    own.load_state_dict(model.state_dict())
    s1 = Scaler(model, scaler=FIXED, format="fp16")
    s2 = Scaler(own, scaler=FIXED, format="fp16")
    got = seen(model)  # hooks after the Scaler's: they see what its hooks return
    out1, g1 = step(model, s1, x, y)
    # The norm reads fc1's rounded output itself (a view of it), not a copy.
    assert got["norm_in"].data_ptr() == got["fc1_out"].data_ptr()
    assert representable(got["norm_in"], "fp16")
    # The same values, outputs and gradients as with a copy (the user's class gets one).
    got_own = seen(own)
    out2, g2 = step(own, s2, x, y)
    assert got_own["norm_in"].data_ptr() != got_own["fc1_out"].data_ptr()
    assert torch.equal(out1, out2)
    assert all(torch.equal(a, b) for a, b in zip(g1, g2))
    assert [r["s"] for r in s1.layer_scales()] == [r["s"] for r in s2.layer_scales()]


def test_an_output_changed_in_place_is_rounded_again():
    class Third(nn.Module):
        def forward(self, h):
            return h.mul_(1 / 3)  # in place: fc1's rounded output no longer holds values of fp16

    model = Stack(between=Third())
    scaler = Scaler(model, scaler=FIXED, format="fp16")
    got = seen(model)
    x, y = torch.randn(5, 6) * 3, torch.randint(0, 3, (5,))
    step(model, scaler, x, y)
    assert not representable(got["fc1_out"], "fp16")
    assert got["norm_in"].data_ptr() != got["fc1_out"].data_ptr()
    assert representable(got["norm_in"], "fp16")
    with torch.no_grad():  # eval: the same rule without autograd
        model(x)
    assert got["norm_in"].data_ptr() != got["fc1_out"].data_ptr()
    assert representable(got["norm_in"], "fp16")


def test_a_layer_of_the_users_that_writes_its_input_gets_a_copy():
    class ScaleInPlace(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.w = nn.Parameter(torch.full((n,), 0.5))

        def forward(self, h):
            return h.mul_(self.w)  # writes to its input: aliasing it would be refused by autograd

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), ScaleInPlace(8), nn.Linear(8, 3))
    ref = nn.Sequential(nn.Linear(6, 8), ScaleInPlace(8), nn.Linear(8, 3))
    ref.load_state_dict(model.state_dict())
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    x, y = torch.randn(5, 6), torch.randint(0, 3, (5,))
    out, grads = step(model, scaler, x, y)
    nn.functional.cross_entropy(ref(x), y).backward()
    # fp32 with power-of-two scales: PyTorch's own gradients, bit for bit.
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, ref.parameters()))
