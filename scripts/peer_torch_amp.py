#!/usr/bin/env python3
"""PyTorch AMP peer for `gradscale bench step --model resnet-mini --device cuda`.

Times the training step of gradscale's built-in `resnet-mini` in PyTorch on the GPU, with
torch.autocast(fp16) + torch.cuda.amp.GradScaler (PyTorch's mixed precision: one global dynamic loss
scale) or in plain fp32, on synthetic data of the same shape, and prints a line in `bench step`'s form:

    python3 scripts/peer_torch_amp.py --mode amp --batch 256 --steps 50 --warmup 5 [--n 1]
    python3 scripts/peer_torch_amp.py --mode fp32 ...

`scripts/gpu_run.sh` runs it next to `gradscale bench step` on the GPU machine (whose image has PyTorch
with CUDA; the data there is synthetic, as for the benchmark it is compared with).

The model mirrors lib/model/spec.cpp's resnet-mini[:n=N] layer by layer: a stem (conv 1->16 3x3 pad 1
without bias, BatchNorm, ReLU), three stages of N basic blocks of widths 16, 32, 64 (the first block of
stages 2 and 3 has stride 2 and a 1x1 projection + BatchNorm shortcut; conv 3x3 without bias, BatchNorm,
ReLU, conv 3x3, BatchNorm, add, ReLU), global average pooling and a Linear 64->10; input [N, 1, 28, 28].
SGD with momentum 0.9, lr 0.05 (gradscale's defaults for the benchmark). PyTorch at its best: cuDNN
autotuning on, the input and labels on the GPU before timing; each timed step ends with a
synchronisation, as `bench step`'s do.
"""

import argparse
import json
import statistics
import sys
import time

from atomic_file import atomic_open


def fail(message):
    print("peer_torch_amp.py: error: " + message, file=sys.stderr)
    sys.exit(2)


def build_resnet_mini(nn, n):
    def bn(c):
        return nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = bn(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = bn(cout)
            self.relu = nn.ReLU()
            self.proj = None
            if stride != 1 or cin != cout:
                self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, 0, bias=False), bn(cout))

        def forward(self, x):
            y = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(y + (x if self.proj is None else self.proj(x)))

    layers = [nn.Conv2d(1, 16, 3, 1, 1, bias=False), bn(16), nn.ReLU()]
    cin = 16
    for stage, width in enumerate((16, 32, 64)):
        for b in range(n):
            layers.append(Block(cin, width, 2 if stage > 0 and b == 0 else 1))
            cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="peer_torch_amp.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("amp", "fp32"), default="amp",
                   help="amp: autocast fp16 + GradScaler; fp32: no autocast, no scaler")
    p.add_argument("--n", type=int, default=1, help="blocks per stage (resnet-mini:n=N), 1..64")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--steps", type=int, default=50, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cuda", help="cuda (the comparison) or cpu (a smoke test: fp32 only)")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args(argv)
    if not 1 <= a.n <= 64:
        fail("--n must be in [1, 64], got %d" % a.n)
    if a.batch < 1 or a.steps < 1 or a.warmup < 0:
        fail("--batch and --steps must be >= 1 and --warmup >= 0")
    return a


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        from torch import nn
    except ImportError as e:
        fail("PyTorch is not installed (%s)" % e)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail("no CUDA device for PyTorch (torch %s, built with CUDA %s)" % (torch.__version__, torch.version.cuda))
    if args.mode == "amp" and not args.device.startswith("cuda"):
        fail("--mode amp needs --device cuda (fp16 autocast and GradScaler are the GPU's)")
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 is fp32, as in gradscale's GEMMs
    torch.backends.cudnn.allow_tf32 = False
    model = build_resnet_mini(nn, args.n).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    amp = args.mode == "amp"
    # torch.amp.GradScaler("cuda") since torch 2.3; torch.cuda.amp.GradScaler before (deprecated after).
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        scaler = torch.amp.GradScaler("cuda", enabled=amp)
    else:
        scaler = torch.cuda.amp.GradScaler(enabled=amp)
    # A few distinct synthetic batches on the device, cycled (the data pipeline is not what is timed).
    gen = torch.Generator(device="cpu").manual_seed(args.seed)
    batches = [(torch.randn(args.batch, 1, 28, 28, generator=gen).to(device),
                torch.randint(0, 10, (args.batch,), generator=gen).to(device)) for _ in range(4)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def step(i):
        x, y = batches[i % len(batches)]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=amp):
            loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return loss

    for i in range(args.warmup):
        step(i)
    sync()
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        loss = step(args.warmup + i)
        sync()
        times.append(time.perf_counter() - t0)
    mean_ms = 1e3 * sum(times) / len(times)
    median_ms = 1e3 * statistics.median(times)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print("peer_torch_amp: torch %s, %s, resnet-mini:n=%d, %s, batch %d, %d steps after %d warm-up"
          % (torch.__version__, name, args.n, "autocast fp16 + GradScaler" if amp else "fp32", args.batch,
             args.steps, args.warmup))
    print("step: mean %.3f ms, median %.3f ms, %.1f steps/s; last loss %.4f, loss scale %s"
          % (mean_ms, median_ms, 1e3 / mean_ms, float(loss.detach()), scaler.get_scale() if amp else "none"))
    if args.json:
        doc = {"torch": torch.__version__, "device": name, "model": "resnet-mini:n=%d" % args.n,
               "mode": args.mode, "batch": args.batch, "steps": args.steps, "warmup": args.warmup,
               "step_ms_mean": mean_ms, "step_ms_median": median_ms}
        with atomic_open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
