"""What making every rank take the same scales costs: two gloo processes on this machine, each with
DistributedDataParallel and the plug-in (fp16 storage, adaptive `measured` with `init_scale: "auto"`),
with the statistics reduced inside backward (`agree_scales=True`, the default) and without
(`agree_scales=False`: each rank on its own rows; the verdict is reduced in both).

    .venv/bin/python python/examples/bench_dist.py [--steps 30]

Prints one Markdown row per model: rank 0's median milliseconds per step of each configuration (after
3 warm-up steps; the two take turns step by step), the ratio, and the collectives per step.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gradscale.torch import Scaler  # noqa: E402
from bench_overhead import models  # noqa: E402

POLICY = {"policy": "adaptive", "method": "measured", "init_scale": "auto"}


class Run:
    def __init__(self, make, data, agree, rank):
        torch.manual_seed(0)
        self.model = make()
        self.ddp = nn.parallel.DistributedDataParallel(self.model)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.scaler = Scaler(self.model, scaler=POLICY, format="fp16", record_every=0, agree_scales=agree)
        x, y = data
        half = slice(rank * len(x) // 2, (rank + 1) * len(x) // 2)
        self.x, self.y = x[half], y[half]
        self.times = []

    def step(self, record):
        t0 = time.perf_counter()
        out = self.ddp(self.x)
        loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), self.y.reshape(-1))
        self.opt.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        if record:
            self.times.append(time.perf_counter() - t0)


def worker(rank, init, steps):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    if rank == 0:
        print("| model (2 ranks, half the batch each) | same scales on every rank | scales per rank | ratio "
              "| collectives per step in backward |")
        print("|---|---|---|---|---|")
    for name, make, data in models():
        runs = [Run(make, data, True, rank), Run(make, data, False, rank)]
        for i in range(steps + 3):
            for r in runs:
                r.step(record=i >= 3)
        agreed, alone = (statistics.median(r.times) * 1e3 for r in runs)
        per_step = runs[0].scaler._reducer.collectives / (steps + 3)
        if rank == 0:
            print(f"| {name} | {agreed:.1f} ms | {alone:.1f} ms | {agreed / alone:.2f} | {per_step:.0f} |", flush=True)
        dist.barrier()
        del runs
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="gradscale_bench_dist_")
    print(f"torch {torch.__version__}, gloo, one thread per rank")
    mp.spawn(worker, args=("file://" + os.path.join(out, "rendezvous"), args.steps), nprocs=2, join=True)


if __name__ == "__main__":
    main()
