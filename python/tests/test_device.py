"""The plug-in's CUDA path: a model on a GPU gets its roundings, statistics and maxima from lib/cuda
(the core's ExternalBackward on device "cuda"). Here it runs on lib/cuda's CPU execution target
(gradscale._core_cpu_target: the same core over the kernels compiled for the CPU, host memory standing
in for the device's), where it must give the host path's scales, verdicts and weights bit for bit; on
a GPU the same comparison runs with CUDA tensors. Models on other devices and autocast are refused."""
import copy
import json

import pytest
import torch
from torch import nn
import torch.nn.functional as F

from gradscale import _core
from gradscale.torch import Scaler
from test_branches import Block, ConvResidual, Tied, _inputs

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
            {"policy": "adaptive", "method": "approx_range", "init_scale": "auto"}, "popart_als"]


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


def _train(model, scaler, x, y, vocab, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    log = []
    for _ in range(steps):
        opt.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out.reshape(-1, vocab) if vocab else out, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        rows = [{k: r[k] for k in ("name", "s", "S_in", "S_out", "underflow_rate", "weight_grad_scale")}
                for r in scaler.layer_scales()]
        log.append((scaler.last_step["loss_scale"], scaler.last_step["skipped"], rows,
                    scaler.loss_grad_stats()))
    return log


@needs_cpu_target
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p if isinstance(p, str) else p["method"])
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
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p if isinstance(p, str) else p["method"])
def test_cuda_tensors_on_a_gpu(policy):
    """On a GPU: the model's tensors in device memory, the core's kernels on PyTorch's stream. The
    scales and verdicts are the CPU run's; the weights agree to rounding (cuBLAS sums the products in
    another order than the CPU, so a few gradients round one ulp apart)."""
    for name, model, x, y, vocab in _models():
        gpu = copy.deepcopy(model).cuda()
        host = _train(model, Scaler(model, scaler=policy, format="fp16", grad_format="fp8_e5m2"), x, y, vocab, 4)
        dev = _train(gpu, Scaler(gpu, scaler=policy, format="fp16", grad_format="fp8_e5m2"),
                     x.cuda(), y.cuda(), vocab, 4)
        assert [s[:2] for s in dev] == [s[:2] for s in host], name
        for p, q in zip(model.parameters(), gpu.parameters()):
            assert (p - q.cpu()).abs().max() < 1e-2, name


def test_a_model_on_several_devices_or_an_unknown_one_is_refused():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2, device="meta"))
    with pytest.raises(ValueError, match="several devices"):
        Scaler(model)
    with pytest.raises(ValueError, match="CPU and on CUDA GPUs"):
        Scaler(nn.Linear(4, 2, device="meta"))


def test_autocast_is_refused_with_the_reason():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"})
    with pytest.raises(TypeError, match="autocast.*before gradscale could apply"):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            scaler.scale(model(torch.randn(4, 16)).sum())


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
def test_the_host_waits_for_the_device_a_fixed_number_of_times_per_step():
    """The CUDA path's cost beyond its kernels: every measured rounding and every controller's
    statistics is one wait (docs/pytorch.md gives the counts). None on the host."""
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
        assert counts[0] > 0 and len(set(counts[1:])) == 1, (name, counts)
        print(f"{name}: {counts[-1]} host waits per step, {len(dev.layer_scales())} layers")
