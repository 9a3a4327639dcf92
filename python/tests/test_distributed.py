"""Data-parallel under torch.distributed (gloo, two processes on this machine): every rank takes the
same verdict — an overflow on one rank skips the step on both — so the policy's S0 and state stay
identical, and DDP, summing gradients that each rank has already unscaled by its own layer scales,
gives the same weights on every rank and the weights of one process with the doubled batch."""
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
