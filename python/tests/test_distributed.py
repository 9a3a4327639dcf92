"""Data-parallel under torch.distributed (gloo, two processes on this machine): every rank takes the
same verdict — an overflow on one rank skips the step on both — so the policy's S0 and state stay
identical, and DDP, summing gradients that each rank has already unscaled by its layer scales,
gives the same weights on every rank and the weights of one process with the doubled batch. Every
rank also takes the same per-layer scales (the statistics they are chosen from reduced over the
ranks inside backward): those of one process with the whole batch."""
import datetime
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
import torch.nn.functional as F

from gradscale.torch import Scaler

STEPS = 6


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))


def _batch(step):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(32, 16, generator=g)
    return x, x[:, :4].argmax(dim=1)


def _train(model, scaler, rank, world, opt, overflow_step):
    record = []
    for step in range(STEPS):
        x, y = _batch(step)
        half = slice(rank * 32 // world, (rank + 1) * 32 // world)
        x, y = x[half], y[half]
        if step == overflow_step and rank == 1:  # one rank's batch overflows
            x = x * 1e6
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        applied = scaler.step(opt)
        scaler.update()
        record.append((applied, scaler.last_step["loss_scale"], scaler.get_scale()))
    return record


def _worker(rank, world, init, out, policy, fmt, overflow_step):
    import faulthandler
    import sys
    faulthandler.dump_traceback_later(120, exit=True, file=sys.stderr)  # a hung rank fails the test
    torch.set_num_threads(1)
    # A rank that never arrives fails the test in a minute instead of hanging it.
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    model = _model()
    ddp = nn.parallel.DistributedDataParallel(model)
    scaler = Scaler(model, scaler=policy, format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    record = _train(ddp, scaler, rank, world, opt, overflow_step)
    torch.save({"record": record, "weights": [p.detach().clone() for p in model.parameters()],
                "state": scaler.state_dict()}, os.path.join(out, f"rank{rank}.pt"))
    # DDP's reducer goes before its process group (destroyed the other way round, a rank could hang
    # at exit), and no rank leaves while the other still talks to it.
    dist.barrier()
    del ddp
    dist.destroy_process_group()


def _run_two(policy, fmt, overflow_step=-1):
    out = tempfile.mkdtemp(prefix="gradscale_ddp_")
    init = "file://" + os.path.join(out, "rendezvous")
    mp.spawn(_worker, args=(2, init, out, policy, fmt, overflow_step), nprocs=2, join=True)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


@pytest.mark.parametrize("policy", ["torch", {"policy": "adaptive", "method": "measured"}])
def test_ranks_take_one_verdict(policy):
    r0, r1 = _run_two(policy, "fp16", overflow_step=2)
    assert r0["record"] == r1["record"]
    assert [applied for applied, _, _ in r0["record"]] == [True, True, False, True, True, True]
    assert r0["state"]["core"]["scaler"] == r1["state"]["core"]["scaler"]
    for a, b in zip(r0["weights"], r1["weights"]):
        assert torch.equal(a, b)


def test_two_ranks_equal_one_process_with_the_doubled_batch():
    """fp32 storage (rounding is the identity), every layer scaling by 4: the per-layer scales cancel
    exactly, and the only difference is the order of the fp32 sums —
    DDP averages two half-batch means where one process takes one mean — so within 1e-6."""
    policy = {"policy": "adaptive", "method": "fixed", "fixed_scale": 4, "init_scale": 8}
    r0, _ = _run_two(policy, "fp32")
    model = _model()
    scaler = Scaler(model, scaler=policy, format="fp32")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        assert scaler.step(opt)
        scaler.update()
    assert all(applied for applied, _, _ in r0["record"])
    for a, b in zip(r0["weights"], model.parameters()):
        assert torch.allclose(a, b.detach(), rtol=1e-6, atol=1e-7)


# ---- per-layer scales: the same on every rank, and the one process's on the whole batch --------------

class _Residual(nn.Module):
    """A join (h read by the shortcut and by `mid`) and three GEMM layers; weights are multiples of 1/16
    (1/256 after `inp`) and inputs multiples of 1/8, so that with e5m2 gradients (2 mantissa bits) every upstream product is
    exact in fp32 whatever the order of its sums: the statistics of a batch split over ranks are then
    exactly the whole batch's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(16, 32)
        self.mid = nn.Linear(32, 32)
        self.head = nn.Linear(32, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randint(-6, 7, p.shape).float() / 16)
            for p in (*self.mid.parameters(), *self.head.parameters()):
                p.div_(16)  # small: their upstream gradients underflow e5m2 unless scaled up

    def forward(self, x):
        h = torch.relu(self.inp(x))
        return self.head(h + self.mid(h))


def _scales_batch(step):
    """32 rows; the second half (rank 1's) 64 times larger, so the halves alone would choose other scales."""
    g = torch.Generator().manual_seed(200 + step)
    x = torch.randint(-8, 9, (32, 16), generator=g).float() / 8
    x[16:] *= 64
    return x, torch.randint(0, 4, (32,), generator=g)


def _record_scales(model, scaler, rows, factors=None):
    """Steps on the batch's `rows`, the loss a sum over them divided by the whole batch's 32 (so each row's
    loss gradient is the one process's), lr 0 (the weights stay the ones a single process has). With
    `factors`, also each step's weight-gradient factors r per layer (a rank stores its rows' part at r:
    the ranks must agree on it, but it need not be the one process's, whose part is the whole sum)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    record = []
    for step in range(SCALE_STEPS):
        x, y = _scales_batch(step)
        opt.zero_grad()
        loss = F.cross_entropy(model(x[rows]), y[rows], reduction="sum") / 32
        scaler.scale(loss).backward()
        s0 = scaler.get_scale()
        layers = [(r["name"], r["s"], r["unbound"], r["S_in"], r["S_out"]) for r in scaler.layer_scales()]
        if factors is not None:
            factors.append([r["weight_grad_scale"] for r in scaler.layer_scales()])
        scaler.step(opt)
        scaler.update()
        record.append((s0, layers, scaler.last_step["skipped"]))
    return record


SCALE_STEPS = 5
SCALE_POLICIES = {"measured": {"policy": "adaptive", "method": "measured", "init_scale": "auto"},
                  "approx_range": {"policy": "adaptive", "method": "approx_range", "init_scale": "auto"}}


def _scales_worker(rank, world, init, out, policy, reduce_scales):
    import faulthandler
    import sys
    faulthandler.dump_traceback_later(120, exit=True, file=sys.stderr)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    model = _Residual()
    ddp = nn.parallel.DistributedDataParallel(model)
    # agree_scales=False: each rank chooses its scales from its own rows (what the previous version did)
    scaler = Scaler(model, scaler=policy, format="fp16", grad_format="fp8_e5m2", agree_scales=reduce_scales)
    factors = []
    record = _record_scales(ddp, scaler, slice(rank * 16, rank * 16 + 16), factors)
    reducer = scaler._reducer
    torch.save({"record": record, "factors": factors, "collectives": reducer.collectives if reducer else 0},
               os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    del ddp
    dist.destroy_process_group()


def _run_two_scales(policy, reduce_scales=True):
    out = tempfile.mkdtemp(prefix="gradscale_ddp_scales_")
    init = "file://" + os.path.join(out, "rendezvous")
    mp.spawn(_scales_worker, args=(2, init, out, policy, reduce_scales), nprocs=2, join=True)
    return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]


@pytest.mark.parametrize("method", sorted(SCALE_POLICIES))
def test_ranks_take_the_whole_batchs_scales(method):
    policy = SCALE_POLICIES[method]
    r0, r1 = _run_two_scales(policy)
    assert r0["record"] == r1["record"]
    # The weight-gradient factors too, and they are not all 1 (else agreeing would prove little).
    assert r0["factors"] == r1["factors"]
    assert any(f != 1 for step in r0["factors"] for f in step)
    model = _Residual()
    one = _record_scales(model, Scaler(model, scaler=policy, format="fp16", grad_format="fp8_e5m2"), slice(0, 32))
    assert r0["record"] == one
    # S0 and the layers' choices vary between steps (else agreeing would prove little)...
    assert len({(s0, tuple(l[1:3] for l in layers)) for s0, layers, _ in one}) >= 3
    assert any(l[1] > 1 for _, layers, _ in one for l in layers)
    # ...and the collectives ran: per step one for S0's statistics, one per controlled layer's query
    # and one per join, each of a few collectives (lib/dist's DataParallel).
    assert r0["collectives"] == r1["collectives"] > 0


def test_without_the_reduction_the_ranks_choose_other_scales():
    """The check above can fail: each rank deciding on its own rows (the halves differ 64-fold) takes
    other scales than the other rank."""
    r0, r1 = _run_two_scales(SCALE_POLICIES["measured"], reduce_scales=False)
    assert r0["record"] != r1["record"]
    assert r0["factors"] != r1["factors"]


# ---- ranks whose passes differ ---------------------------------------------------------------------

class _Branchy(nn.Module):
    """`extra` runs on rank 1 only: a data-dependent branch."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(16, 16)
        self.extra = nn.Linear(16, 16)
        self.head = nn.Linear(16, 4)

    def forward(self, x, branch):
        h = torch.relu(self.inp(x))
        if branch:
            h = torch.relu(self.extra(h))
        return self.head(h)


def _branch_worker(rank, world, init, out, agree_scales):
    import faulthandler
    import sys
    faulthandler.dump_traceback_later(120, exit=True, file=sys.stderr)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    model = _Branchy()
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16",
                    agree_scales=agree_scales)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = _batch(0)
    result = {"error": None, "applied": []}
    for _ in range(2):
        opt.zero_grad()
        try:
            loss = scaler.scale(F.cross_entropy(model(x, branch=rank == 1), y))
        except RuntimeError as e:
            result["error"] = str(e)
            break
        loss.backward()
        result["applied"].append(scaler.step(opt))
        scaler.update()
    torch.save(result, os.path.join(out, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("agree_scales", [True, False])
def test_ranks_with_different_branches_get_an_error_not_an_abort(agree_scales):
    """With agree_scales the statistics are reduced layer by layer inside backward: ranks running
    different layers are refused at scale(), on every rank, with a Python error (they once paired one
    rank's layer with another's and aborted the process). Without it they train, one verdict a step."""
    out = tempfile.mkdtemp(prefix="gradscale_ddp_branch_")
    init = "file://" + os.path.join(out, "rendezvous")
    mp.spawn(_branch_worker, args=(2, init, out, agree_scales), nprocs=2, join=True)
    r0, r1 = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(2)]
    if agree_scales:
        assert "different layers" in r0["error"] and "different layers" in r1["error"]
    else:
        assert r0["error"] is None and r1["error"] is None
        assert r0["applied"] == r1["applied"] == [True, True]
