"""What the plug-in costs per training step: plain PyTorch (fp32, no scaler) against the plug-in
emulating fp16 storage with a global policy (`torch`) and with adaptive `measured` — on the CPU, or
with --device cuda on a GPU, where PyTorch's own mixed precision (autocast fp16 + GradScaler) runs in
the same turns for comparison.

    .venv/bin/python python/examples/bench_overhead.py [--steps 30] [--threads 1] [--device cuda] [--batch-mult K]
                                                       [--only TEXT] [--cpu-time]

--threads N sets torch's threads and OpenBLAS's (gradscale._blas). --only TEXT times the models whose
name contains TEXT (one model per process: another model's allocations leave the heap differently).
--cpu-time (CPU only) takes the thread's CPU time instead of the wall clock, so that another process on
the machine moves the figures less.

Prints one Markdown row per model: milliseconds per step of each configuration (median of --steps
after 3 warm-up steps; the configurations take turns step by step; on a GPU each step ends with a
synchronisation), the ratio of adaptive `measured` to the emulated global-policy step, and the
process's minor page faults per step (glibc's heap trimming gives freed memory back and faults it in
again: thousands a step cost milliseconds). The first model, 24 small layers whose arithmetic is
negligible, gives the host's cost per layer call (forward and backward), printed after the table.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import time

import torch
from torch import nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))
from gradscale._blas import blas_threads, set_blas_threads  # noqa: E402
from gradscale.torch import Scaler  # noqa: E402
from train_compare import CharLM, ResNetMini  # noqa: E402


# A chain of small layers whose arithmetic is negligible: its row measures the host's cost per layer.
DEEP = 24
DEEP_NAME = f"{DEEP} x Linear(32, 32) + ReLU"


def models(mult=1):
    """The five models with their batches, each batch `mult` times its default size."""
    g = torch.Generator().manual_seed(0)
    deep = lambda: nn.Sequential(*[m for _ in range(DEEP) for m in (nn.Linear(32, 32), nn.ReLU())])  # noqa: E731
    n = 8 * mult
    yield f"{DEEP_NAME}, batch {n}", deep, (torch.randn(n, 32, generator=g), torch.randint(0, 32, (n,), generator=g))
    mlp = lambda: nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))  # noqa: E731
    n = 128 * mult
    yield f"mlp 784-256-256-10, batch {n}", mlp, (torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g))
    n = 32 * mult
    yield f"resnet-mini CNN, batch {n}", ResNetMini, (torch.randn(n, 1, 28, 28, generator=g), torch.randint(0, 10, (n,), generator=g))
    seq = torch.randint(0, 80, (16 * mult, 65), generator=g)
    yield f"char transformer, {16 * mult}x64 tokens", (lambda: CharLM(80)), (seq[:, :-1], seq[:, 1:])
    try:
        import torchvision
    except ImportError:
        return
    n = 16 * mult
    yield f"torchvision resnet18, batch {n}, 32x32", (lambda: torchvision.models.resnet18(num_classes=10)), \
        (torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g))


# What a step's time is read from: the wall clock, or the thread's CPU time (--cpu-time).
clock = time.perf_counter


class Run:
    """One configuration: its own copy of the model, optimizer and (maybe) scaler."""

    def __init__(self, make, data, scaler_cfg, device):
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.model = make().to(self.device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.amp = scaler_cfg == "amp"  # PyTorch's autocast fp16 + GradScaler (a GPU only)
        if self.amp:
            self.scaler = (torch.amp.GradScaler("cuda") if hasattr(torch.amp, "GradScaler")
                           else torch.cuda.amp.GradScaler())
        else:
            self.scaler = Scaler(self.model, scaler=scaler_cfg, format="fp16", record_every=0) if scaler_cfg else None
        self.x, self.y = (t.to(self.device) for t in data)
        self.times = []
        self.faults = []  # minor page faults of the process during each recorded step

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def step(self, record):
        self._sync()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0 = clock()
        with torch.autocast("cuda", dtype=torch.float16) if self.amp else contextlib.nullcontext():
            out = self.model(self.x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), self.y.reshape(-1))
        self.opt.zero_grad()
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self._sync()
        if record:
            self.times.append(clock() - t0)
            self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)


def time_configs(make, data, configs, steps, device):
    """Medians in ms, and the median minor page faults per step (memory the allocator gave back to the
    system and takes again); the configurations take turns step by step, so a change in the
    machine's load falls on all of them alike."""
    runs = [Run(make, data, c, device) for c in configs]
    for i in range(steps + 3):
        for r in runs:
            r.step(record=i >= 3)
    return [statistics.median(r.times) * 1e3 for r in runs], [statistics.median(r.faults) for r in runs]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (adds PyTorch AMP to the comparison)")
    ap.add_argument("--batch-mult", type=int, default=1,
                    help="each model's batch this many times its default (larger steps: where the GEMMs lead)")
    ap.add_argument("--only", default="", metavar="TEXT", help="only the models whose name contains TEXT")
    ap.add_argument("--cpu-time", action="store_true", help="the thread's CPU time, not the wall clock (CPU only)")
    args = ap.parse_args()
    if args.batch_mult < 1:
        ap.error(f"--batch-mult must be at least 1, not {args.batch_mult}")
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, not {args.steps}")
    if args.only and not any(args.only in name for name, _, _ in models(args.batch_mult)):
        ap.error(f"--only {args.only!r} names no model: "
                 + ", ".join(repr(name) for name, _, _ in models(args.batch_mult)))
    gpu = args.device.startswith("cuda")
    if args.cpu_time and gpu:
        ap.error("--cpu-time times the host's thread: it is for --device cpu (a GPU step ends with a wait)")
    if args.cpu_time:
        global clock
        clock = time.thread_time
    torch.set_num_threads(args.threads)
    set_blas_threads(args.threads)  # OpenBLAS's pool, which torch's setting does not reach
    where = (torch.cuda.get_device_name(torch.device(args.device)) if gpu else
             f"cpu, threads {args.threads} (torch's; OpenBLAS's: {blas_threads()})")
    print(f"{where}, torch {torch.__version__}" + (", thread CPU time" if args.cpu_time else ""))
    configs = [None, "torch", {"policy": "adaptive", "method": "measured"}] + (["amp"] if gpu else [])
    amp_header = " PyTorch AMP (autocast fp16 + GradScaler) | measured / AMP |" if gpu else ""
    print("| model | plain PyTorch fp32 | plug-in fp16, `torch` | plug-in fp16, adaptive `measured` | torch / plain "
          "| measured / torch | page faults per step (plain / torch / measured) |" + amp_header)
    print("|---|---|---|---|---|---|---|" + ("---|---|" if gpu else ""))
    per_layer = None
    for name, make, data in models(args.batch_mult):
        if args.only not in name:
            continue
        times, faults = time_configs(make, data, configs, args.steps, args.device)
        plain, glob, meas = times[:3]
        if name.startswith(DEEP_NAME):
            per_layer = ((glob - plain) / DEEP * 1e3, (meas - plain) / DEEP * 1e3)
        row = (f"| {name} | {plain:.1f} ms | {glob:.1f} ms | {meas:.1f} ms | {glob / plain:.2f} | {meas / glob:.2f} "
               f"| {faults[0]:.0f} / {faults[1]:.0f} / {faults[2]:.0f} |")
        if gpu:
            row += f" {times[3]:.2f} ms | {meas / times[3]:.2f} |"
        print(row, flush=True)
    if per_layer is not None:
        print(f"\nthe host's cost per layer ({DEEP_NAME}): `torch` {per_layer[0]:.0f} us, "
              f"adaptive `measured` {per_layer[1]:.0f} us over plain PyTorch's")
    if gpu:  # the plug-in's waits for the device (each measured rounding, each controller's statistics)
        for name, make, data in models(args.batch_mult):
            if args.only not in name:
                continue
            run = Run(make, data, {"policy": "adaptive", "method": "measured"}, args.device)
            run.step(False)
            before = run.scaler.host_waits
            run.step(False)
            print(f"{name}: adaptive measured waits for the GPU {run.scaler.host_waits - before} times a step")


if __name__ == "__main__":
    main()
