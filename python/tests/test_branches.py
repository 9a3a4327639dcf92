"""No sum ever mixes scales: with fp32 storage (rounding is the identity) every power-of-two scale is
exact, so gradients under per-layer scaling must equal plain PyTorch's bit for bit — on every
topology where autograd adds gradients from several paths. A sum that mixed scales (what a scaler
that follows module order does on a residual shortcut) would be off by a power of two."""
import copy

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale import _core
from gradscale.torch import Scaler, _backward_pass

# Every GEMM layer multiplies its upstream gradient by 4, S0 = 8: paths through different numbers of
# layers carry different scales.
FIXED = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8,
         "scale_upper_bound": 16, "accum_upper_bound": 2 ** 40}


class ResidualNoModule(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        h = h + self.b(torch.relu(h))  # shortcut with no module on it
        return self.head(h)


class ReadTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.c = nn.Linear(6, 6)
        self.head = nn.Linear(12, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.head(torch.cat([self.b(h), self.c(h) * h], dim=1))  # h read by three ops


class CalledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.shared = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        h = self.shared(torch.relu(self.shared(h)))  # one module, two calls, two scales for its weight
        return self.head(h)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.mid = nn.Linear(6, 6)
        self.out = nn.Linear(6, 11, bias=False)
        self.out.weight = self.emb.weight  # tied: two parts at two scales into one parameter

    def forward(self, idx):
        return self.out(torch.relu(self.mid(self.emb(idx)))).mean(dim=1)


class Functional(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.w = nn.Parameter(torch.randn(6, 6) * 0.3)  # used functionally by the container
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        h = F.linear(F.gelu(h), self.w) + self.b(h)
        return self.head(h)


class InPlaceAfter(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        out = self.b(h)
        out += h  # in-place add on a module's output
        out.relu_()
        return self.head(out)


class ConvResidual(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c2 = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        h = torch.relu(self.bn(self.c1(x)))
        h = h + self.c2(h)
        return self.head(h.mean(dim=(2, 3)))


def _inputs(name):
    g = torch.Generator().manual_seed(3)
    if name == "tied":
        return torch.randint(0, 11, (4, 5), generator=g), torch.randint(0, 11, (4,), generator=g)
    if name == "conv":
        return torch.randn(4, 2, 5, 5, generator=g), torch.randint(0, 3, (4,), generator=g)
    return torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)


CASES = {"residual": ResidualNoModule, "read_twice": ReadTwice, "called_twice": CalledTwice, "tied": Tied,
         "functional": Functional, "in_place": InPlaceAfter, "conv": ConvResidual}


def _reference_and_scaled(model, x, y, policy):
    torch.manual_seed(0)
    ref = copy.deepcopy(model)
    F.cross_entropy(ref(x), y).backward()
    scaler = Scaler(model, scaler=policy, format="fp32")
    loss = F.cross_entropy(model(x), y)
    scaler.scale(loss).backward()
    return ref, scaler


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradients_equal_fp32_bit_for_bit(name):
    torch.manual_seed(1)
    model = CASES[name]()
    x, y = _inputs(name)
    ref, scaler = _reference_and_scaled(model, x, y, FIXED)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), f"{name}: {n} differs from PyTorch's fp32 gradient"
    # Parts really arrived at different scales (else the test could not see a mixed sum); the parts
    # of a tied weight or of a module called twice are unscaled one by one instead.
    assert scaler._tracker.joins >= 1 or name in ("tied", "called_twice")


def test_a_mixed_sum_would_be_caught():
    """The check above can fail: with a join hook that forgets T/S_i the residual case differs."""
    from gradscale.torch import _backward_pass
    torch.manual_seed(1)
    model = ResidualNoModule()
    x, y = _inputs("residual")
    original = _backward_pass.BackwardPass._join_hook

    def broken(self, producer, layer):
        def hook(grad_outputs):
            if not self._active():
                return None
            parts = self._parts.pop(producer, None)
            if not parts:
                return None
            total = sum(g for _, g, _ in parts)
            self._into[self._nodes[producer]] = parts[0][2]
            return (total,)
        return hook

    _backward_pass.BackwardPass._join_hook = broken
    try:
        ref, _ = _reference_and_scaled(model, x, y, FIXED)
    finally:
        _backward_pass.BackwardPass._join_hook = original
    assert not all(torch.equal(p.grad, q.grad) for p, q in zip(model.parameters(), ref.parameters()))


def test_a_deep_copied_model_drives_its_own_scaler():
    """copy.deepcopy(model) copies the scaler with it: the copy's layer hooks record into the copy's
    scaler (and its gradients carry the scales), the original's scaler sees nothing."""
    torch.manual_seed(1)
    model = ResidualNoModule()
    x, y = _inputs("residual")
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    twin = copy.deepcopy(model)
    twin_scaler = next(iter(twin._forward_pre_hooks.values())).__self__
    assert twin_scaler is not scaler
    ref = copy.deepcopy(model)
    ref_scaler = next(iter(ref._forward_pre_hooks.values())).__self__
    ref_scaler.remove()
    F.cross_entropy(ref(x), y).backward()
    twin_scaler.scale(F.cross_entropy(twin(x), y)).backward()
    assert [r["sent"] for r in twin_scaler.layer_scales()] == [False, True, True]
    assert twin_scaler._tracker.joins == 1
    assert not any(r["ran"] for r in scaler.layer_scales())
    for (n, p), (_, q) in zip(twin.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), n


class KeywordInputs(nn.Module):
    """Layers given their input by keyword (torch 1.13's pre-hooks do not see keyword arguments)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)
        self.head = nn.Linear(6, 3)

    def forward(self, x):
        h = self.a(x)
        h = self.b(input=torch.relu(h)) + h
        return self.head(input=h)


class Recording(nn.Linear):
    """A Linear that keeps the input its forward was given."""

    def forward(self, input):  # noqa: A002 (nn.Linear's name for it)
        self.seen = input.detach().clone()
        return super().forward(input)


def test_keyword_tensor_arguments_are_layer_inputs():
    """A tensor passed by keyword crosses the layer boundary like a positional one: rounded in the
    forward, and its gradient carries the layer's local scale (S0 = 8, every GEMM layer ×4: head gets 8
    and sends 32; b gets 32 and sends 128; a gets the join of 32 and 128, at 128, and sends nothing)."""
    torch.manual_seed(1)
    model = KeywordInputs()
    x, y = _inputs("keyword")
    ref, scaler = _reference_and_scaled(model, x, y, FIXED)
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), f"{n} differs from PyTorch's fp32 gradient"
    rows = {r["name"]: r for r in scaler.layer_scales()}
    assert [(rows[n]["sent"], rows[n]["s"], rows[n]["S_in"]) for n in ("head", "b", "a")] == \
        [(True, 4.0, 8.0), (True, 4.0, 32.0), (False, 1.0, 128.0)]  # a's input needs no gradient
    assert scaler._tracker.joins == 1

    lin = Recording(6, 3)
    Scaler(lin, scaler="static:1", format="fp16")
    lin(input=x)
    rounded = x.clone()
    from gradscale import _core
    _core.quantize_(rounded.data_ptr(), rounded.numel(), "fp16")
    assert not torch.equal(rounded, x) and torch.equal(lin.seen, rounded)


def test_keyword_wrapper_follows_deepcopy_and_remove():
    """The copy of a model runs its own layers' forwards through its own scaler; remove() puts each
    module's forward back."""
    torch.manual_seed(1)
    model = KeywordInputs()
    x, y = _inputs("keyword")
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    twin = copy.deepcopy(model)
    assert twin.b.forward.module is twin.b and twin.b.forward.scaler is not scaler
    twin_scaler = twin.b.forward.scaler
    twin_scaler.scale(F.cross_entropy(twin(x), y)).backward()
    assert [r["sent"] for r in twin_scaler.layer_scales()] == [False, True, True]  # a: x needs no gradient
    assert not any(r["ran"] for r in scaler.layer_scales())
    assert all(p.grad is None for p in model.parameters())
    scaler.remove()
    assert "forward" not in model.b.__dict__ and model.b(input=x).shape == (4, 6)


class Block(nn.Module):
    """A transformer block with tied embedding / output weights."""

    def __init__(self, vocab=13, d=8, heads=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(6, d) * 0.1)
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)
        self.lm = nn.Linear(d, vocab, bias=False)
        self.lm.weight = self.emb.weight

    def forward(self, idx):
        h = self.emb(idx) + self.pos[: idx.shape[1]]
        a = self.ln1(h)
        mask = torch.triu(torch.ones(idx.shape[1], idx.shape[1], dtype=torch.bool, device=idx.device), 1)
        h = h + self.attn(a, a, a, attn_mask=mask, need_weights=False)[0]
        h = h + self.down(F.gelu(self.up(self.ln2(h))))
        return self.lm(h)


def test_transformer_block_gradients_equal_fp32():
    torch.manual_seed(2)
    model = Block()
    idx = torch.randint(0, 13, (3, 6), generator=torch.Generator().manual_seed(4))
    ref = copy.deepcopy(model)
    F.cross_entropy(ref(idx[:, :-1]).reshape(-1, 13), idx[:, 1:].reshape(-1)).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32")
    loss = F.cross_entropy(model(idx[:, :-1]).reshape(-1, 13), idx[:, 1:].reshape(-1))
    scaler.scale(loss).backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), n
    names = [r["name"] for r in scaler.layer_scales()]
    assert {"emb", "ln1", "attn", "attn.out_proj", "up", "down", "model"} <= set(names), names


def test_chosen_layers_and_parameters_of_no_layer():
    """layers= names the modules that are layers (a container among them): the others' parameters
    belong to no layer and are still rounded and unscaled; gradients stay exact."""
    torch.manual_seed(2)
    model = ResidualNoModule()
    x, y = _inputs("residual")
    ref = copy.deepcopy(model)
    F.cross_entropy(ref(x), y).backward()
    scaler = Scaler(model, scaler=FIXED, format="fp32", layers=["b", "head"])
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), n
    assert [r["name"] for r in scaler.layer_scales()] == ["b", "head"]
    fresh = Scaler(copy.deepcopy(model), scaler=FIXED, format="fp32", layers=["a", "b", "head"])
    rows = fresh.layer_scales()  # before any step: every layer listed, none ran
    assert [r["name"] for r in rows] == ["a", "b", "head"] and not any(r["ran"] for r in rows)


# ---- the join's sum is gradscale's (SPEC §5, lib/model/join.cpp) ---------------------------------------
# Parts (g_k, S_k) brought to the target T are summed as Σ g_k · float(T/S_k) in fp32 from 0, each term
# one fp32 product, then rounded once to grad_format. The rule is written out here in float32 tensors
# (the factor a float32 tensor, so nothing depends on how torch casts a Python number) and compared with
# what the plug-in's join hands back, as int32 bits.

# Every GEMM layer multiplies its upstream gradient by 3 (not a power of two), S0 = 8: the parts of the
# residual's join arrive at 24 and 72, so one of them is multiplied by float(72 / 24) = 3.
BY_THREE = {"policy": "adaptive", "method": "fixed", "fixed_scale": 3, "power_of_two": False, "init_scale": 8,
            "scale_upper_bound": 16, "accum_upper_bound": 2 ** 40}


def _rule(parts, target: float, grad_format: str) -> torch.Tensor:
    """gradscale's join of `parts` [(g, S)] at T: the fp32 sum from 0, then the one rounding."""
    total = torch.zeros(parts[0][0].shape, dtype=torch.float32)
    for g, s in parts:
        total = total + g.detach() * torch.tensor(target / s, dtype=torch.float32)
    total = total.contiguous()
    _core.quantize_(total.data_ptr(), total.numel(), grad_format)
    return total


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int32)


@pytest.mark.parametrize("grad_format", ["fp16", "fp8_e5m2"])
def test_a_join_of_parts_at_different_scales_is_the_cpp_rule(monkeypatch, grad_format):
    """The residual's join under the plug-in, its parts at 24 and 72 (T = 72), is the rule bit for bit."""
    joins = []
    join_parts = _backward_pass.join_parts

    def recorded(core, layer, parts, grad_outputs):
        grads, target = join_parts(core, layer, parts, grad_outputs)  # scales: the core's handles
        joins.append(([(j, g.detach().clone(), core.scale_value(s)) for j, g, s in parts], core.scale_value(target),
                      list(grads)))
        return grads, target

    monkeypatch.setattr(_backward_pass, "join_parts", recorded)
    torch.manual_seed(1)
    model = ResidualNoModule()
    x, y = _inputs("residual")
    scaler = Scaler(model, scaler=BY_THREE, format="fp16", grad_format=grad_format)
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    assert len(joins) == 1
    parts, target, grads = joins[0]
    assert sorted(s for _, _, s in parts) == [24.0, 72.0] and target == 72.0
    assert all(j == 0 for j, _, _ in parts)
    expected = _rule([(g, s) for _, g, s in parts], target, grad_format)
    assert torch.count_nonzero(expected) > 0
    assert torch.equal(_bits(grads[0]), _bits(expected))


@pytest.mark.parametrize("grad_format", ["fp32", "fp16"])
def test_the_join_sum_starts_from_zero_in_any_memory_layout(grad_format):
    """Parts given to the join directly: zeros that are all -0 sum to +0 as in C++ (0 + -0), a factor not
    exact in float32 (T/S = 7/3) is rounded to float before the product, and parts in two memory layouts
    (channels_last and contiguous) are summed element by element all the same."""
    model = nn.Linear(2, 2)
    scaler = Scaler(model, scaler="static:1", format="fp32", grad_format=grad_format)
    core = scaler._core
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(2, 3, 4, 4, generator=gen).contiguous(memory_format=torch.channels_last)
    b = torch.randn(2, 3, 4, 4, generator=gen)
    a[0, 0] = -0.0
    b[0, 0] = -0.0
    core.begin_step(False)
    try:
        parts = [(0, a, core.scale_handle(3.0)), (0, b, core.scale_handle(7.0))]  # scales as the core's handles
        grads, handle = _backward_pass.join_parts(core, -1, parts, (None,))
        target = core.scale_value(handle)
    finally:
        core.abandon_step()
    assert target == core.join_target([float(a.abs().max()), float(b.abs().max())], [3.0, 7.0]) == 7.0
    expected = _rule([(a, 3.0), (b, 7.0)], target, grad_format)
    assert torch.equal(_bits(grads[0]), _bits(expected))
    zero = grads[0][0, 0]
    assert torch.all(zero == 0) and not torch.any(torch.signbit(zero))
    if grad_format == "fp32":  # the comparison sees the factor's rounding: a float64 factor gives other bits
        in_double = (a.double() * (7.0 / 3.0)).float() + b
        assert not torch.equal(_bits(in_double), _bits(expected))


def test_the_join_sum_has_torchs_layout_on_every_call():
    """The join's sum is laid out as torch's sum of the parts would be, for each mix of layouts, on the
    first call and on later ones (the layout is found once per mix of strides and remembered)."""
    model = nn.Linear(2, 2)
    scaler = Scaler(model, scaler="static:1", format="fp32")
    core = scaler._core
    gen = torch.Generator().manual_seed(6)
    last = lambda t: t.contiguous(memory_format=torch.channels_last)  # noqa: E731
    flipped = lambda t: t.transpose(1, 3).contiguous().transpose(1, 3)  # noqa: E731
    seen = set()
    for _ in range(2):
        for first, second in [(last, last), (last, torch.clone), (torch.clone, last), (flipped, last),
                              (flipped, flipped), (torch.clone, torch.clone)]:
            a = first(torch.randn(2, 3, 4, 5, generator=gen))
            b = second(torch.randn(2, 3, 4, 5, generator=gen))
            core.begin_step(False)
            try:
                parts = [(0, a, core.scale_handle(1.0)), (0, b, core.scale_handle(1.0))]
                grads, _ = _backward_pass.join_parts(core, -1, parts, (None,))
            finally:
                core.abandon_step()
            assert grads[0].stride() == (a + b).stride()
            assert torch.equal(grads[0], a + b)
            seen.add(grads[0].stride())
    assert len(seen) >= 3  # the mixes give different layouts: a fixed answer would fail
