"""The plug-in's CUDA path: a model on a GPU gets its roundings, statistics and maxima from lib/cuda
(the core's ExternalBackward on device "cuda"). Here it runs on lib/cuda's CPU execution target
(gradscale._core_cpu_target: the same core over the kernels compiled for the CPU, host memory standing
in for the device's), where it must give the host path's scales, verdicts and weights bit for bit; on
a GPU the same comparison runs with CUDA tensors. Under torch.autocast the layers keep computing in
float32 (the ops between them keep autocast's dtype). Models on other devices are refused."""
import contextlib
import copy
import json

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale import _core
from gradscale.torch import Scaler
from test_branches import Block, ConvResidual, Tied, _inputs
from training_patterns_common import penalised_loss

try:
    from gradscale import _core_cpu_target  # noqa: F401
    HAVE_CPU_TARGET = True
except ImportError:
    HAVE_CPU_TARGET = False

needs_cpu_target = pytest.mark.skipif(not HAVE_CPU_TARGET, reason="gradscale._core_cpu_target not built "
                                      "(it needs a build with CUDA: nvcc on PATH)")
needs_gpu = pytest.mark.skipif(not (torch.cuda.is_available() and _core.cuda_built()),
                               reason="no CUDA device for torch, or a core built without CUDA")

POLICIES = ["torch", {"policy": "adaptive", "method": "measured"},
            {"policy": "adaptive", "method": "approx_range", "init_scale": "auto"}, "popart_als",
            {"policy": "adaptive", "method": "measured", "init_scale": "auto", "cast_form": "measured"}]


def _policy_id(policy) -> str:
    if isinstance(policy, str):
        return policy
    return policy["method"] + ("_auto" if policy.get("cast_form") == "measured" else "")


def _models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 16, generator=g) * 0.05
    yield "mlp", mlp, x, torch.randint(0, 10, (32,), generator=g), None
    torch.manual_seed(1)
    block = Block(vocab=13, d=16, heads=2)  # attention, LayerNorm, GELU, tied embedding: joins
    idx = torch.randint(0, 13, (8, 7), generator=g)
    yield "block", block, idx[:, :-1], idx[:, 1:].reshape(-1), 13


def _step(model, scaler, opt, x, y, vocab):
    """One training step; its record: S0, the verdict, each layer's decisions, the loss gradient's statistics."""
    opt.zero_grad()
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, vocab) if vocab else out, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    rows = [{k: r[k] for k in ("name", "s", "S_in", "S_out", "underflow_rate", "weight_grad_scale")}
            for r in scaler.layer_scales()]
    return (scaler.last_step["loss_scale"], scaler.last_step["skipped"], rows, scaler.loss_grad_stats())


def _train(model, scaler, x, y, vocab, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    return [_step(model, scaler, opt, x, y, vocab) for _ in range(steps)]


@needs_cpu_target
@pytest.mark.parametrize("policy", POLICIES, ids=_policy_id)
def test_the_cuda_path_gives_the_host_paths_bits(policy):
    for name, model, x, y, vocab in _models():
        twin = copy.deepcopy(model)
        host = _train(model, Scaler(model, scaler=policy, format="fp16", grad_format="fp8_e5m2", record_every=2),
                      x, y, vocab, 8)
        cuda = _train(twin, Scaler(twin, scaler=policy, format="fp16", grad_format="fp8_e5m2", record_every=2,
                                   _cpu_target=True), x, y, vocab, 8)
        assert cuda == host, name
        for (n, p), q in zip(model.named_parameters(), twin.parameters()):
            assert torch.equal(p, q), (name, n)


@needs_cpu_target
def test_the_cuda_path_launches_one_kernel_per_rounding():
    """Kernels launched per Linear layer and step on the CUDA path (the CPU execution target counts them).
    One each for the roundings of the layer's input, output, working weight and bias (4), one for the
    gradient it receives, and one per weight gradient for its rounding and its unscale together; an
    adaptive policy adds its decision (the statistics' launch takes it) and applies s in the upstream
    gradient's rounding; a weight gradient of one block's values (here all) takes its r in its own
    rounding's launch."""
    from gradscale import _core_cpu_target as target
    x = torch.randn(8, 32)
    y = torch.randint(0, 10, (8,))

    def per_step(policy, depth):
        torch.manual_seed(0)
        model = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(32, 32), nn.ReLU())],
                              nn.Linear(32, 10))
        scaler = Scaler(model, scaler=policy, format="fp16", record_every=0, _cpu_target=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        _step(model, scaler, opt, x, y, None)  # the first step sets up what later ones reuse
        before = target.kernel_launches()
        for _ in range(2):
            _step(model, scaler, opt, x, y, None)
        return (target.kernel_launches() - before) / 2

    for policy, most in (("torch", 8), ({"policy": "adaptive", "method": "measured"}, 9)):
        per_layer = (per_step(policy, 6) - per_step(policy, 2)) / 4
        assert 0 < per_layer <= most, (policy, per_layer)


@needs_cpu_target
def test_joins_and_tied_weights_on_the_cuda_path():
    """Joins take their parts' maxima on the device; tied weights' parts are unscaled there."""
    for cls in (Tied, ConvResidual):
        torch.manual_seed(0)
        model = cls()
        twin = copy.deepcopy(model)
        x, y = _inputs("conv" if cls is ConvResidual else "tied")
        policy = {"policy": "adaptive", "method": "measured"}
        logs = []
        for m, target in ((model, False), (twin, True)):
            scaler = Scaler(m, scaler=policy, format="bf16", grad_format="fp8_e4m3", _cpu_target=target)
            logs.append(_train(m, scaler, x, y, None, 4))
        assert logs[0] == logs[1], cls.__name__
        for p, q in zip(model.parameters(), twin.parameters()):
            assert torch.equal(p, q), cls.__name__


@needs_gpu
@pytest.mark.parametrize("policy", POLICIES, ids=_policy_id)
def test_cuda_tensors_on_a_gpu(policy):
    """On a GPU: the model's tensors in device memory, the core's kernels on PyTorch's stream. At every
    step the scales and verdicts, and every layer's s, S_in, S_out and weight-gradient factor, are the
    CPU run's, and the step moves the weights as the CPU's does, to rounding. cuBLAS and torch's CUDA
    reductions sum in another order than the CPU (relative differences up to about 1e-4 in fp32), so a
    gradient near a rounding tie of fp8_e5m2 (two mantissa bits) rounds one ulp apart; one ulp in
    [0.25, 0.5) is 2^-4, which SGD's lr 0.5 turns into 2^-5. Steps compound such differences (on the
    H200, four free-running steps of adaptive `measured` left 10 of block.pos's 96 elements more than
    1e-3 apart), so each step starts both runs from the CPU run's weights. Allowed per step: at most 1%
    of a tensor's elements (at least one) off by more than 1e-3, none by more than 2^-4."""
    decisions = ("s", "S_in", "S_out", "weight_grad_scale")
    for name, model, x, y, vocab in _models():
        gpu = copy.deepcopy(model).cuda()
        runs = [(m, Scaler(m, scaler=policy, format="fp16", grad_format="fp8_e5m2"),
                 torch.optim.SGD(m.parameters(), lr=0.5), xx, yy)
                for m, xx, yy in ((model, x, y), (gpu, x.cuda(), y.cuda()))]
        for step in range(4):
            with torch.no_grad():
                for p, q in zip(model.parameters(), gpu.parameters()):
                    q.copy_(p)
            host, dev = (_step(*run, vocab) for run in runs)
            assert dev[:2] == host[:2], (name, step)
            assert ([[r[k] for k in decisions] for r in dev[2]]
                    == [[r[k] for k in decisions] for r in host[2]]), (name, step)
            for (pname, p), q in zip(model.named_parameters(), gpu.parameters()):
                diff = (p - q.cpu()).detach().abs()
                assert diff.max() <= 2.0 ** -4, (name, step, pname, float(diff.max()))
                assert int((diff > 1e-3).sum()) <= max(1, p.numel() // 100), (name, step, pname)


@needs_gpu
def test_cuda_autocast_leaves_the_layers_in_float32():
    """On a GPU under autocast fp16: an MLP of layers trains with the bits it has without autocast."""
    runs = []
    for autocast in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
        scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16")
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        x, y = torch.randn(16, 16).cuda(), (torch.arange(16) % 4).cuda()
        for _ in range(3):
            opt.zero_grad()
            with torch.autocast("cuda", dtype=torch.float16) if autocast else contextlib.nullcontext():
                out = model(x)
            scaler.scale(F.cross_entropy(out, y)).backward()
            scaler.step(opt)
            scaler.update()
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(p, q) for p, q in zip(*runs))


def test_a_model_on_several_devices_or_an_unknown_one_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2, device="meta"))
    with pytest.raises(ValueError, match="several devices"):
        Scaler(model)
    with pytest.raises(ValueError, match="CPU and on CUDA GPUs"):
        Scaler(nn.Linear(4, 2, device="meta"))


def _autocast_bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def test_under_autocast_the_layers_still_compute_in_float32():
    """Inside a torch.autocast region the layers run without autocast (SPEC §5 needs their backward
    products in fp32, multiplied by s before their one rounding), so an MLP whose every op is a layer
    or elementwise trains bit for bit as without autocast."""
    runs = []
    for autocast in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="bf16",
                        grad_format="fp8_e5m2")
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        x, y = torch.randn(16, 16, generator=torch.Generator().manual_seed(1)), torch.arange(16) % 4
        log = []
        for _ in range(5):
            opt.zero_grad()
            with _autocast_bf16() if autocast else contextlib.nullcontext():
                out = model(x)
            assert out.dtype == torch.float32
            scaler.scale(F.cross_entropy(out, y)).backward()
            scaler.step(opt)
            scaler.update()
            log.append([(r["s"], r["S_in"]) for r in scaler.layer_scales()] + [scaler.last_step["loss_scale"]])
        runs.append((log, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    assert all(torch.equal(p, q) for p, q in zip(runs[0][1], runs[1][1]))


class _Probe(nn.Linear):
    """A Linear that notes whether autocast was on while it computed."""
    seen: list = []

    def forward(self, x):
        _Probe.seen.append((torch.is_autocast_cpu_enabled(), x.dtype))
        return super().forward(x)


def test_under_autocast_ops_outside_the_layers_keep_autocasts_dtype():
    """Between layers, autocast's ops run in its dtype: under autocast, a matmul of two layers' outputs
    gives the bits of the same model that casts to bfloat16 itself, without autocast — the layers run
    in float32 either way, and the bfloat16 gradient reaches them in float32, rounded to grad_format
    where it enters them."""

    class Net(nn.Module):
        def __init__(self, explicit):
            super().__init__()
            self.explicit = explicit
            self.q, self.k, self.head = _Probe(8, 8), _Probe(8, 8), _Probe(8, 3)

        def forward(self, x):
            q, k = self.q(x), self.k(x)
            if self.explicit:
                q, k = q.bfloat16(), k.bfloat16()
            scores = q @ k.transpose(-1, -2)  # outside every layer: autocast's bf16
            assert scores.dtype == torch.bfloat16
            return self.head(scores).mean(dim=1)

    x, y = torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(2)), torch.tensor([0, 1, 2, 0])
    runs = []
    for explicit in (False, True):
        torch.manual_seed(0)
        model = Net(explicit)
        scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        _Probe.seen.clear()
        for _ in range(3):
            opt.zero_grad()
            with contextlib.nullcontext() if explicit else _autocast_bf16():
                out = model(x)
            scaler.scale(F.cross_entropy(out, y)).backward()
            assert scaler.step(opt)
            scaler.update()
        assert _Probe.seen and all(not on and dtype == torch.float32 for on, dtype in _Probe.seen)
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(p, q) for p, q in zip(*runs))


def test_half_precision_parameters_are_refused():
    with pytest.raises(ValueError, match="parameters must be float32.*torch.float16"):
        Scaler(nn.Linear(4, 2).half())


def test_a_tensor_on_another_device_than_the_layers_is_refused():
    model = nn.Sequential(nn.Linear(4, 4))
    Scaler(model)
    with pytest.raises(RuntimeError, match="meta met layers whose parameters are on cpu"):
        model(torch.zeros(2, 4, device="meta"))


@needs_cpu_target
def test_a_trace_on_the_cuda_path(tmp_path):
    """The trace writer reads the device run's records (the core's own TraceWriter type)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, trace=str(tmp_path / "t"),
                    trace_every=1, _cpu_target=True)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    _train(model, scaler, x, y, None, 3)
    scaler.close()
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines[1:-1]]  # between the header and the summary
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all("wgrad" in layer for r in records for layer in r["layers"])  # statistics every step


@needs_cpu_target
def test_the_host_waits_for_the_device_once_per_step():
    """The CUDA path decides on the device: the layers' local scales (their controllers' rules), the
    joins' targets and S0 (the adaptive policy's floor reads the loss gradient's histogram: its rule,
    Scaler::device_loss_rule) stay there, so a step of adaptive `measured` waits once — for the step's
    measurements — on the MLP and on the attention block (joins, LayerNorm, a tied embedding) alike.
    None on the host."""
    for name, model, x, y, vocab in _models():
        twin = copy.deepcopy(model)
        host = Scaler(model, scaler={"policy": "adaptive", "method": "measured"})
        _train(model, host, x, y, vocab, 2)
        assert host.host_waits == 0
        dev = Scaler(twin, scaler={"policy": "adaptive", "method": "measured"}, _cpu_target=True)
        counts = []
        for _ in range(3):
            before = dev.host_waits
            _train(twin, dev, x, y, vocab, 1)
            counts.append(dev.host_waits - before)
        assert counts == [1, 1, 1], (name, counts)
        print(f"{name}: {counts[-1]} host waits per step, {len(dev.layer_scales())} layers")


def _waits_per_step(model, scaler, steps=2):
    """The host's waits for the device in each of `steps` SGD steps of `model` (16 inputs, 10 classes)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16), torch.arange(8) % 10
    waits = []
    for _ in range(steps):
        before = scaler.host_waits
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        scaler.step(opt)
        scaler.update()
        waits.append(scaler.host_waits - before)
    return waits


@needs_cpu_target
def test_a_step_waits_once_whatever_the_depth_on_the_cuda_path():
    """SPEC §5's local scales, §6.5's factors r and S0 are decided on the device, from the scaler's rules:
    a step of adaptive `measured` waits once, for the step's measurements — not once more per layer,
    weight or bias. S0 from init_scale "auto" with a moment-based cast_form has no device rule: the host
    reads the loss gradient for it, one wait more."""
    cases = [({}, 1), ({"init_scale": "auto", "cast_form": "measured"}, 1), ({"init_scale": "auto"}, 2)]
    for depth in (2, 6):
        for keys, waits in cases:
            torch.manual_seed(0)
            layers = []
            for _ in range(depth):
                layers += [nn.Linear(16, 16), nn.ReLU()]
            model = nn.Sequential(*layers, nn.Linear(16, 10))
            scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured", **keys},
                            format="fp16", grad_format="fp8_e5m2", _cpu_target=True)
            assert _waits_per_step(model, scaler) == [waits, waits], (depth, keys)


@needs_cpu_target
def test_a_join_costs_no_wait_on_the_cuda_path():
    """SPEC §5's join target reads the maximum of every part: on the CUDA path T is chosen on the device
    from them, so a tensor read by k heads costs no wait, whatever k."""
    class Heads(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.trunk = nn.Linear(16, 16)
            self.heads = nn.ModuleList(nn.Linear(16, 10) for _ in range(k))

        def forward(self, x):
            h = torch.relu(self.trunk(x))  # read by every head: a join of k parts in backward
            return sum(head(h) for head in self.heads)

    waits = {}
    for k in (1, 2, 3):
        torch.manual_seed(0)
        model = Heads(k)
        scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, _cpu_target=True)
        waits[k] = _waits_per_step(model, scaler)[-1]
    assert waits == {1: 1, 2: 1, 3: 1}, waits


@needs_cpu_target
def test_a_gradient_penalty_on_the_cuda_path_reads_each_scale_decided_on_the_device():
    """create_graph differentiates each rounding as the identity times its scale factor: on the CUDA path
    those factors are read from the device's decisions — a LayerNorm after a Linear passes its gradient
    on at s = 1 (the Linear's s stays the Linear's) — and the penalised gradients are PyTorch's fp32
    ones, bit for bit, under power-of-two scales."""
    policy = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8}
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), nn.Linear(8, 8), nn.LayerNorm(8),
                          nn.Linear(8, 3))
    ref = copy.deepcopy(model)
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)

    penalised_loss(ref, lambda loss: loss, x, y).backward()
    scaler = Scaler(model, scaler=policy, format="fp32", _cpu_target=True)
    scaler.scale(penalised_loss(model, scaler.scale, x, y)).backward()
    for (n, p), (_, q) in zip(model.named_parameters(), ref.named_parameters()):
        assert torch.equal(p.grad, q.grad), n
    assert scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()


@needs_cpu_target
def test_a_layer_called_twice_keeps_the_host_paths_records_on_the_cuda_path():
    """A LayerNorm called twice, each time after a Linear whose scale is decided on the device: its row
    keeps the first call's S_in and the last call's S_out, as on the host."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.head = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)
            self.norm = nn.LayerNorm(8)

        def forward(self, x):
            return self.head(self.norm(self.b(self.norm(self.a(x)))))

    policy = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8}
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g)
    torch.manual_seed(0)
    model = Twice()
    twin = copy.deepcopy(model)
    host = _train(model, Scaler(model, scaler=policy, format="fp16", record_every=1), x, y, None, 2)
    cuda = _train(twin, Scaler(twin, scaler=policy, format="fp16", record_every=1, _cpu_target=True), x, y, None, 2)
    assert cuda == host
    norm = [r for r in host[-1][2] if r["name"] == "norm"][0]
    assert norm["S_in"] != norm["S_out"]  # the two calls received different scales


@pytest.mark.parametrize("policy", POLICIES, ids=_policy_id)
def test_scale_and_backward_read_no_tensor_value(monkeypatch, policy):
    """On a GPU, reading a tensor's value (float(), .item(), bool(), a copy to the host) waits for the
    device: the forward, scale() and backward read none — the loss's value comes with the verdict, in
    step() — and the step reports that loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 10))
    scaler = Scaler(model, scaler=policy, format="fp16", grad_format="fp8_e5m2")
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 16, generator=g), torch.randint(0, 10, (8,), generator=g)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        reads = []
        with monkeypatch.context() as patch:
            for name in ("__float__", "__bool__", "__int__", "item", "tolist", "cpu", "numpy"):
                original = getattr(torch.Tensor, name)
                patch.setattr(torch.Tensor, name,
                              lambda t, *a, _name=name, _original=original: reads.append(_name) or _original(t, *a))
            loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
        assert reads == []
        scaler.step(opt)
        scaler.update()
        assert scaler.last_step["loss"] == loss.item()


@needs_cpu_target
def test_a_join_of_more_parts_than_the_device_takes_is_the_hosts_on_the_cuda_path():
    """A join of more than 32 parts (lib/cuda's choose_join_scale takes 32) is chosen on the host: the
    parts' maxima and their scales, decided on the device, are read then (two waits), and the layers after
    it decide on the device again from new entries — the bits, scales and records are the host path's."""
    class Heads(nn.Module):
        def __init__(self, k):
            super().__init__()
            self.stem, self.trunk = nn.Linear(16, 16), nn.Linear(16, 16)
            self.heads = nn.ModuleList(nn.Linear(16, 10) for _ in range(k))

        def forward(self, x):
            h = torch.relu(self.trunk(torch.relu(self.stem(x))))  # read by every head: a join of k parts
            return sum(head(h) for head in self.heads)

    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 16, generator=g) * 0.05, torch.randint(0, 10, (8,), generator=g)
    policy = {"policy": "adaptive", "method": "measured"}
    waits = {}
    for k in (32, 33):
        torch.manual_seed(0)
        model = Heads(k)
        twin = copy.deepcopy(model)
        host = _train(model, Scaler(model, scaler=policy, format="fp16", grad_format="fp8_e5m2", record_every=1),
                      x, y, None, 3)
        scaler = Scaler(twin, scaler=policy, format="fp16", grad_format="fp8_e5m2", record_every=1, _cpu_target=True)
        cuda = _train(twin, scaler, x, y, None, 3)
        assert cuda == host, k
        for p, q in zip(model.parameters(), twin.parameters()):
            assert torch.equal(p, q), k
        waits[k] = _waits_per_step(twin, scaler)[-1]
    assert waits == {32: 1, 33: 3}, waits  # the step's measurements; and the 33 parts' maxima and scales
