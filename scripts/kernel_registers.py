#!/usr/bin/env python3
"""What ptxas gives each lib/cuda kernel, and the occupancy that follows: registers, spills, static
shared memory and the blocks an SM holds at once. Needs no GPU: it compiles lib/cuda's sources again
(the build's own nvcc command from compile_commands.json, for one architecture, `-Xptxas -v`, output
discarded) and reads ptxas's report.

    python3 scripts/kernel_registers.py [--build build] [--arch 90] [--block 256] [--jobs 2] [--only TEXT]
    python3 scripts/kernel_registers.py --report FILE [--arch 90] [--block 256]

--report reads a saved ptxas report (what `nvcc -Xptxas -v` writes to stderr) instead of compiling.

Prints one Markdown row per kernel (each template instance): registers per thread, spill stores and
loads (bytes), stack frame, static shared memory, blocks per SM, and the SM's threads in use (of 2048).
Every lib/cuda kernel is launched with kBlock = 256 threads (lib/cuda/launch.h; --block for another
size). Blocks per SM are the smallest of the register file's, shared memory's and the thread and block
limits, with registers allocated per warp in units of 256 (as the occupancy calculator counts them).
A grid-stride kernel with more blocks than the GPU holds at once runs in waves: docs/gpu.md.

Exit 2 (with a message) when the build has no compile_commands.json, lib/cuda was not built, nvcc
fails, or a report cannot be read or holds no kernel.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

# Per-SM limits of the architectures lib/cuda builds machine code for (CMAKE_CUDA_ARCHITECTURES).
ARCH = {
    "80": {"registers": 65536, "threads": 2048, "blocks": 32, "smem": 164 * 1024, "block_smem_reserved": 1024},
    "90": {"registers": 65536, "threads": 2048, "blocks": 32, "smem": 228 * 1024, "block_smem_reserved": 1024},
}
REGISTER_UNIT = 256  # registers are given to a warp in units of 256


def fail(message: str) -> None:
    print(f"kernel_registers.py: {message}", file=sys.stderr)
    sys.exit(2)


def blocks_per_sm(registers: int, smem: int, block: int, arch: dict) -> int:
    warps = (block + 31) // 32
    per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
    by_registers = arch["registers"] // (per_warp * warps) if registers else arch["blocks"]
    by_smem = arch["smem"] // (smem + arch["block_smem_reserved"])
    by_threads = arch["threads"] // block
    return max(0, min(by_registers, by_smem, by_threads, arch["blocks"]))


def command_for(entry: dict, arch: str) -> list:
    """The build's nvcc command for one source, for `arch` only, with ptxas's report and no output."""
    args = shlex.split(entry["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a.startswith("--generate-code") or a.startswith("-gencode") or a.startswith("--gpu-architecture"):
            continue
        out.append(a)
    return out + [f"--generate-code=arch=compute_{arch},code=[sm_{arch}]", "-Xptxas", "-v", "-o", os.devnull]


ENTRY = re.compile(r"Compiling entry function '([^']+)' for 'sm_(\d+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse(report: str):
    """(mangled name, registers, spill stores, spill loads, stack frame, smem, arch) per kernel."""
    rows = []
    name = arch = None
    frame = (0, 0, 0)
    for line in report.splitlines():
        m = ENTRY.search(line)
        if m:
            name, arch = m.group(1), m.group(2)
            frame = (0, 0, 0)
            continue
        m = FRAME.search(line)
        if m and name:
            frame = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            continue
        m = USED.search(line)
        if m and name:
            rows.append((name, int(m.group(1)), frame[1], frame[2], frame[0], int(m.group(2) or 0), arch))
            name = None
    return rows


def demangle(names: list) -> dict:
    tool = shutil.which("c++filt")
    if tool is None:
        return {n: n for n in names}
    done = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=False)
    out = done.stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(name: str) -> str:
    """A kernel's name without namespaces, its template arguments kept, its parameters dropped."""
    name = re.sub(r"gradscale::cuda::(\(anonymous namespace\)::)?", "", name)
    depth = 0
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return re.sub(r"^void ", "", name[:i])
    return name


def read_report(path: str, arch: str):
    try:
        with open(path, encoding="utf-8") as f:
            report = f.read()
    except OSError as e:
        fail(f"cannot read '{path}': {e.strerror}")
    rows = [r for r in parse(report) if r[6] == arch]
    if not rows:
        fail(f"'{path}' reports no kernel compiled for sm_{arch} (ptxas's 'Compiling entry function' lines)")
    return [(os.path.basename(path), rows)]


def compile_all(args):
    db = os.path.join(args.build, "compile_commands.json")
    if not os.path.isfile(db):
        fail(f"{db} not found: configure the build first (scripts/build.sh writes it)")
    with open(db, encoding="utf-8") as f:
        entries = [e for e in json.load(f) if re.search(r"/lib/cuda/[^/]+\.cu$", e.get("file", ""))
                   and "nvcc" in e.get("command", "")]
    if not entries:
        fail(f"{db} compiles no lib/cuda/*.cu with nvcc: configure with -DGRADSCALE_CUDA=ON")

    def compile_one(entry):
        done = subprocess.run(command_for(entry, args.arch), cwd=entry["directory"], capture_output=True,
                              text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"nvcc failed on {entry['file']}:\n{done.stderr[-2000:]}")
        return os.path.basename(entry["file"]), parse(done.stderr + done.stdout)

    try:
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            results = sorted(pool.map(compile_one, entries))
    except RuntimeError as e:
        fail(str(e))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", default="build", help="the CMake build folder (default: build)")
    parser.add_argument("--arch", default="90", choices=sorted(ARCH), help="compute capability (default: 90)")
    parser.add_argument("--block", type=int, default=256, help="threads per block (default: 256, kBlock)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compilations at once")
    parser.add_argument("--only", default="", help="kernels whose name contains TEXT")
    parser.add_argument("--report", help="a saved ptxas report to read instead of compiling")
    args = parser.parse_args()
    if not 1 <= args.block <= 1024:
        fail(f"--block {args.block}: a block has 1 to 1024 threads")
    if args.jobs < 1:
        fail(f"--jobs {args.jobs}: at least 1")
    results = read_report(args.report, args.arch) if args.report else compile_all(args)
    names = demangle([r[0] for _, rows in results for r in rows])
    arch = ARCH[args.arch]
    print(f"sm_{args.arch}, {args.block} threads per block")
    print()
    print("| source | kernel | registers | spill stores / loads (bytes) | stack frame | static smem | blocks per SM | threads per SM |")
    print("|---|---|---|---|---|---|---|---|")
    for source, rows in results:
        for mangled, regs, stores, loads, frame, smem, _ in rows:
            name = short(names[mangled])
            if args.only and args.only not in name:
                continue
            blocks = blocks_per_sm(regs, smem, args.block, arch)
            print(f"| {source} | `{name}` | {regs} | {stores} / {loads} | {frame} | {smem} | {blocks} | "
                  f"{blocks * args.block} |")


if __name__ == "__main__":
    main()
