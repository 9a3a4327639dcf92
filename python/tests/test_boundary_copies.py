"""The forward copies at layer boundaries: a layer output the Scaler rounded, read untouched by a
torch.nn layer, is not rounded into a second copy (the same values, one pass and one tensor fewer); an
output changed in place since, or read by a layer of the user's own (which may write to its input),
gets its own rounded copy as before."""
import pytest
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



class SeenLinear(nn.Linear):
    """nn.Linear noting the address of the weight it computes with (the Scaler's working copy)."""

    def forward(self, x):
        self.seen.append(self.weight.data_ptr())
        return super().forward(x)


def seeing(model):
    for name in ("fc1", "fc2"):
        old = getattr(model, name)
        new = SeenLinear(old.in_features, old.out_features)
        new.load_state_dict(old.state_dict())
        new.seen = []
        setattr(model, name, new)
    return model


def test_a_parameters_working_copy_is_written_into_the_same_buffer_every_step():
    x, y = torch.randn(5, 6) * 3, torch.randint(0, 3, (5,))
    model = seeing(Stack())
    scaler = Scaler(model, scaler=FIXED, format="fp16")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        step(model, scaler, x, y)
        scaler.step(opt)
        scaler.update()
    with torch.no_grad():  # eval too
        model(x)
    # One address for every call: the steps (and their optimizer updates) allocate no working copy.
    assert len(set(model.fc1.seen)) == 1 and len(set(model.fc2.seen)) == 1
    assert model.fc1.seen[0] != model.fc1.weight.data_ptr()  # a copy, not the master
    # The buffers hold this step's masters rounded: the same forward as a fresh Scaler's.
    fresh = Stack()
    fresh.load_state_dict(model.state_dict())
    Scaler(fresh, scaler=FIXED, format="fp16")
    with torch.no_grad():
        assert torch.equal(model(x), fresh(x))


def test_a_working_copy_a_live_graph_holds_is_never_overwritten():
    """A graph kept alive across a change of the masters keeps computing with the weights of its own
    forward: the second forward gets a new copy, not the first one's buffer written over."""
    x = torch.randn(5, 6) * 3
    y = torch.randint(0, 3, (5,))

    def first_pass_input_gradient(second_forward):
        torch.manual_seed(0)
        model = seeing(Stack())
        scaler = Scaler(model, scaler=FIXED, format="fp16")
        xi = x.clone().requires_grad_()
        out = model(xi)  # its graph holds this forward's working copies
        if second_forward:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(0.25)  # as an optimizer step would
            kept = model(x)  # a second graph, alive with the first  # noqa: F841
            assert model.fc1.seen[0] != model.fc1.seen[1]
        scaler.scale(nn.functional.cross_entropy(out, y)).backward()
        return xi.grad, [p.grad for p in model.parameters()]

    alone = first_pass_input_gradient(False)
    both = first_pass_input_gradient(True)
    assert torch.equal(both[0], alone[0])
    assert all(torch.equal(a, b) for a, b in zip(both[1], alone[1]))


def _kept_across_passes(seed, gradients):
    """Three batches through a Stack under `gradients(model, scaler, x, y)` (its parameters' gradients of
    one pass): a `.detach()` of each pass's gradients kept, and a copy made at once, both compared after
    the last pass."""
    gen = torch.Generator().manual_seed(seed)
    batches = [(torch.randn(5, 6, generator=gen) * 3, torch.randint(0, 3, (5,), generator=gen)) for _ in range(3)]
    model = Stack()
    scaler = Scaler(model, scaler=FIXED, format="fp16")
    kept, copies = [], []
    for x, y in batches:
        grads = gradients(model, scaler, x, y)
        kept.append([g.detach() for g in grads])
        copies.append([g.clone() for g in grads])
        del grads
    for k, c in zip(kept, copies):
        assert all(torch.equal(a, b) for a, b in zip(k, c))
    assert not torch.equal(kept[0][0], kept[1][0])  # the batches' gradients differ


def test_a_gradient_kept_from_an_earlier_step_is_never_written_again():
    """`.grad` set to None between steps (torch 2's zero_grad default): a `.grad.detach()` the user
    keeps holds that step's gradient, whatever the plug-in reuses for the next one."""
    def through_grad(model, scaler, x, y):
        for p in model.parameters():
            p.grad = None
        step(model, scaler, x, y)
        return [p.grad for p in model.parameters()]
    _kept_across_passes(3, through_grad)


def test_a_gradient_torch_autograd_grad_returned_is_never_written_again():
    """torch.autograd.grad hands its results to the caller (no `.grad`): a `.detach()` of one that the
    caller keeps after the result itself is gone holds that pass's gradient through later passes."""
    def returned(model, scaler, x, y):
        loss = nn.functional.cross_entropy(model(x), y)
        grads = list(torch.autograd.grad(scaler.scale(loss), list(model.parameters())))
        scaler.update()
        return grads
    _kept_across_passes(4, returned)


class BiasUnused(nn.Module):
    """A layer that owns a bias its forward never reads (it stays without a gradient in PyTorch)."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(3, 6))
        self.bias = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return x @ self.weight.t()


class Twice(nn.Module):
    """One Parameter registered under two names of one module (weight tying inside a layer)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(6, 6))
        self.b = self.a

    def forward(self, x):
        return x @ self.a + x @ self.b.t()


def _working_weights_nodes(loss):
    """The WorkingWeights nodes of a loss's graph, each with the leaves it feeds."""
    found, seen_nodes, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        if type(node).__name__ == "WorkingWeightsBackward":
            found.append([n for n, _ in node.next_functions if n is not None])
        stack.extend(n for n, _ in node.next_functions)
    return found


def test_a_layer_calls_parameters_are_one_node_and_their_gradients_exact():
    """fp32 under power-of-two scales: the gradients are PyTorch's bit for bit, with one WorkingWeights
    node per layer call (a Linear's weight and bias together), an unused parameter's gradient None as
    in PyTorch, and a parameter registered twice given the sum of its two uses."""
    gen = torch.Generator().manual_seed(2)
    x, y = torch.randn(5, 6, generator=gen), torch.randint(0, 3, (5,), generator=gen)
    for make in (lambda: nn.Sequential(nn.Linear(6, 6), nn.Tanh(), BiasUnused()),
                 lambda: nn.Sequential(Twice(), nn.Tanh(), nn.Linear(6, 3))):
        torch.manual_seed(0)
        plain = make()
        model = make()
        model.load_state_dict(plain.state_dict())
        if isinstance(model[0], Twice):
            model[0].b = model[0].a  # load_state_dict keeps the tie; said again for the reader
        nn.functional.cross_entropy(plain(x), y).backward()
        # fp32 values under power-of-two scales, with working copies (a shadow substitutes them in fp32).
        scaler = Scaler(model, scaler=FIXED, format="fp32", shadow=True)
        loss = nn.functional.cross_entropy(model(x), y)
        nodes = _working_weights_nodes(loss)
        assert [len(leaves) for leaves in nodes] == [2, 2]  # two layer calls, two parameters each
        if isinstance(model[0], Twice):
            assert any(leaves[0] is leaves[1] for leaves in nodes)  # the tied one's two copies
        scaler.scale(loss).backward()
        for (name, p), q in zip(model.named_parameters(), plain.parameters()):
            if q.grad is None:
                assert p.grad is None, name
            else:
                assert torch.equal(p.grad, q.grad), name
        if isinstance(model[2], BiasUnused):
            assert model[2].bias.grad is None and model[2].weight.grad is not None
        scaler.remove()


class OwnLinear(nn.Linear):
    """nn.Linear's arithmetic in a class of the user's: its call swaps the working copies into the module."""


class OwnConv2d(nn.Conv2d):
    """nn.Conv2d's arithmetic in a class of the user's."""


class ConvNet(nn.Module):
    def __init__(self, linear=nn.Linear, conv=nn.Conv2d):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = conv(2, 4, 3, padding=1)
        self.conv2 = conv(4, 4, 3, stride=2, bias=False)
        self.fc1 = linear(36, 16)
        self.fc2 = linear(16, 3, bias=False)

    def forward(self, x):
        h = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc2(torch.relu(self.fc1(h.flatten(1))))


def test_torch_nns_own_linear_and_conv_compute_as_a_subclass_of_theirs():
    """torch.nn's own Linear and Conv2d are called with their working copies as arguments (nothing
    swapped into the module); a subclass of them, whose forward the plug-in cannot know, with the copies
    swapped in. The same training either way: outputs, gradients, weights and scales, bit for bit."""
    def train(linear, conv):
        model = ConvNet(linear, conv)
        scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16")
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(2)
        outs = []
        for _ in range(3):
            x, y = torch.randn(5, 2, 8, 8, generator=gen) * 4, torch.randint(0, 3, (5,), generator=gen)
            opt.zero_grad()
            out = model(x)
            scaler.scale(nn.functional.cross_entropy(out, y)).backward()
            outs.append(out.detach().clone())
            grads = [p.grad.clone() for p in model.parameters()]
            scaler.step(opt)
            scaler.update()
        with torch.no_grad():  # and a call without a graph
            outs.append(model(torch.randn(2, 2, 8, 8, generator=gen) * 4))
        return outs, grads, [p.detach().clone() for p in model.parameters()], scaler.layer_scales()

    own, theirs = train(nn.Linear, nn.Conv2d), train(OwnLinear, OwnConv2d)
    for a, b in zip(own[:3], theirs[:3]):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    assert [(r["s"], r["S_in"]) for r in own[3]] == [(r["s"], r["S_in"]) for r in theirs[3]]
    assert [r["emulation"] for r in own[3]] == ["gemm"] * 4


def test_a_linear_or_convolution_output_is_rounded_where_it_lies():
    """The new output of torch.nn's own Linear or Conv2d goes through its Exit in place (one tensor
    fewer): what the model returns is that tensor, changed once; a subclass's output gets a copy."""
    for linear, conv, in_place in ((nn.Linear, nn.Conv2d, True), (OwnLinear, OwnConv2d, False)):
        model = ConvNet(linear, conv)
        Scaler(model, format="fp16")
        seen = {}
        model.fc1.register_forward_hook(lambda m, i, o: seen.__setitem__("fc1", o))
        model.conv1.register_forward_hook(lambda m, i, o: seen.__setitem__("conv1", o))
        model(torch.randn(3, 2, 8, 8) * 3)
        for name in ("fc1", "conv1"):
            assert representable(seen[name], "fp16")
            assert (seen[name]._version == 1) == in_place, name  # mark_dirty's one change


def test_an_output_a_hook_of_the_users_saw_first_is_never_changed():
    """A forward hook registered before the Scaler (or a global one) may keep the layer's output and
    build on it (an activation penalty): the Scaler rounds a copy, never that tensor, and the penalty's
    backward runs."""
    import torch.nn.modules.module as module_hooks

    def train(global_hook):
        model = ConvNet()
        kept = []

        def keep(m, i, o):
            kept.append((o, o.detach().clone()))
        handle = module_hooks.register_module_forward_hook(keep) if global_hook else \
            model.fc1.register_forward_hook(keep)
        try:
            scaler = Scaler(model, format="fp16")
            out = model(torch.randn(3, 2, 8, 8) * 3)
            penalty = sum(o.pow(2).mean() for o, _ in kept)
            scaler.scale(nn.functional.cross_entropy(out, torch.tensor([0, 1, 2])) + 1e-3 * penalty).backward()
        finally:
            handle.remove()
        assert kept and all(torch.equal(o, raw) for o, raw in kept)
        assert all(p.grad is not None for p in model.parameters())
    train(global_hook=False)
    train(global_hook=True)


class OwnConv1d(nn.Conv1d):
    """nn.Conv1d's arithmetic in a class of the user's."""


def _pair(own, linear_or_conv):
    return {nn.Linear: OwnLinear, nn.Conv1d: OwnConv1d, nn.Conv2d: OwnConv2d}[linear_or_conv] if own else linear_or_conv


DIRECT_CASES = {
    "3-D input to Linear": (lambda o: nn.Sequential(_pair(o, nn.Linear)(8, 6), nn.ReLU(),
                                                    _pair(o, nn.Linear)(6, 3, bias=False)), (2, 5, 8), {}),
    "gradient penalty": (lambda o: nn.Sequential(_pair(o, nn.Conv2d)(3, 4, 3, padding=1), nn.Tanh(),
                                                 nn.Flatten(), _pair(o, nn.Linear)(4 * 36, 3)), (2, 3, 6, 6),
                         {"penalty": True}),
    "frozen weight": (lambda o: nn.Sequential(_pair(o, nn.Linear)(8, 6), nn.Tanh(), _pair(o, nn.Linear)(6, 3)),
                      (4, 8), {"freeze": True}),
    "reflect padding": (lambda o: nn.Sequential(_pair(o, nn.Conv1d)(3, 4, 3, padding=1, padding_mode="reflect"),
                                                nn.ReLU(), _pair(o, nn.Conv1d)(4, 2, 3)), (2, 3, 9), {}),
    "channels_last": (lambda o: nn.Sequential(_pair(o, nn.Conv2d)(3, 4, 3, padding=1), nn.ReLU(),
                                              _pair(o, nn.Conv2d)(4, 2, 3, stride=2, bias=False)), (2, 3, 9, 9),
                      {"channels_last": True}),
}


def _direct_case(make, shape, own, penalty=False, freeze=False, channels_last=False):
    torch.manual_seed(0)
    model = make(own)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1)) * 3
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    if freeze:
        model[0].weight.requires_grad_(False)
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16")
    xin = x.clone().requires_grad_(penalty)
    out = model(xin)
    loss = out.pow(2).mean()
    if penalty:
        g, = torch.autograd.grad(scaler.scale(loss), xin, create_graph=True)
        loss = loss + g.pow(2).sum()
    scaler.scale(loss).backward()
    with torch.no_grad():
        evaluated = model(x)
    grads = [p.grad for p in model.parameters()]
    return [out.detach(), evaluated] + grads, [r["s"] for r in scaler.layer_scales()], out.stride()


@pytest.mark.parametrize("case", list(DIRECT_CASES))
def test_the_direct_call_and_the_output_in_place_change_no_bit(case):
    """torch.nn's own Linear/Conv (called directly, output rounded in place) against subclasses (copies
    swapped in, output copied): the same outputs, evaluation, gradients (None for a frozen weight),
    scales and output strides — with 3-D inputs, a gradient penalty's double backward, frozen
    weights, reflect padding and channels_last."""
    make, shape, options = DIRECT_CASES[case]
    own, theirs = _direct_case(make, shape, False, **options), _direct_case(make, shape, True, **options)
    assert len(own[0]) == len(theirs[0])
    assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(own[0], theirs[0]))
    assert own[1:] == theirs[1:]


def test_a_layer_whose_class_changes_after_the_scaler_is_called_as_it_is_now():
    """A torch.nn.Linear whose class is changed after the Scaler attached (to a subclass with its own
    forward, or by a parametrization of its weight) runs that class's forward, not F.linear."""
    import torch.nn.utils.parametrize as parametrize

    class Twice(nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class Negated(nn.Module):
        def forward(self, w):
            return -w

    x = torch.randn(2, 4)
    model = nn.Sequential(nn.Linear(4, 3))
    Scaler(model, format="fp32")
    before = model(x)
    model[0].__class__ = Twice
    assert torch.equal(model(x), 2 * before)
    model = nn.Sequential(nn.Linear(4, 3))
    Scaler(model, format="fp32")
    before = model(x)
    parametrize.register_parametrization(model[0], "weight", Negated())
    assert torch.allclose(model(x), 2 * model[0].bias - before)
