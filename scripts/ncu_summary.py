#!/usr/bin/env python3
"""Per-kernel device time from Nsight Compute's raw CSV, for the GPU step's breakdown below the layer
(docs/gpu.md): the launches grouped by kernel (its name without namespaces, template arguments and
parameters), each with its launches, total and mean time and share of all kernels' time, largest
first. The CSV is what

    ncu --clock-control none --csv --page raw --metrics gpu__time_duration.sum PROGRAM ...

prints; anything before its header (the program's own output, ncu's ==PROF== lines) is skipped.

    scripts/ncu_summary.py FILE [--top N]
"""
import argparse
import csv
import sys

METRIC = "gpu__time_duration.sum"
TO_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0,
         "second": 1e3, "s": 1e3}


def fail(message):
    print(f"ncu_summary.py: error: {message}", file=sys.stderr)
    sys.exit(2)


def kernel_name(full):
    """'void ns::(anonymous namespace)::im2col_kernel<float>(const float *, int)' -> 'im2col_kernel'."""
    name = full.replace("(anonymous namespace)", "")
    depth, kept = 0, []
    for ch in name:  # drop template arguments, then the parameter list
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(depth - 1, 0)
        elif depth == 0:
            kept.append(ch)
    name = "".join(kept).split("(")[0].strip()
    name = name.split(" ")[-1]  # the return type
    return name.split("::")[-1] or full


def read_launches(path):
    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        fail(f"cannot read '{path}': {e.strerror}")
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        fail(f"'{path}' has no ncu CSV header (a line starting with \"ID\"): was ncu run with --csv --page raw?")
    rows = list(csv.reader(lines[start:]))
    header = rows[0]
    for column in ("Kernel Name", METRIC):
        if column not in header:
            fail(f"'{path}': the CSV has no column '{column}' (ncu --metrics {METRIC})")
    name_at, metric_at = header.index("Kernel Name"), header.index(METRIC)
    unit = "nsecond"
    body = rows[1:]
    if body and body[0] and body[0][0] == "":  # the units row
        unit = body[0][metric_at]
        body = body[1:]
    if unit not in TO_MS:
        fail(f"'{path}': unknown unit '{unit}' for {METRIC}")
    launches = []
    for n, row in enumerate(body, start=start + 3):
        if len(row) <= max(name_at, metric_at):
            continue  # a line of the program's output after the table
        try:
            ms = float(row[metric_at].replace(",", "")) * TO_MS[unit]
        except ValueError:
            fail(f"'{path}' line {n}: {METRIC} is '{row[metric_at]}', not a number")
        launches.append((kernel_name(row[name_at]), ms))
    if not launches:
        fail(f"'{path}': the CSV lists no kernel launch")
    return launches


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--top", type=int, default=25, help="kernels to list (default 25)")
    args = parser.parse_args()
    if args.top < 1:
        fail(f"--top must be at least 1, got {args.top}")
    launches = read_launches(args.file)
    kernels = {}
    for name, ms in launches:
        count, total = kernels.get(name, (0, 0.0))
        kernels[name] = (count + 1, total + ms)
    all_ms = sum(ms for _, ms in launches)
    print(f"ncu_summary: {len(launches)} launches of {len(kernels)} kernels, {all_ms:.3f} ms of device time")
    print(f"{'kernel':<48} {'launches':>8} {'total ms':>10} {'mean us':>10} {'share':>7}")
    ranked = sorted(kernels.items(), key=lambda kv: (-kv[1][1], kv[0]))
    for name, (count, total) in ranked[: args.top]:
        share = 100.0 * total / all_ms if all_ms > 0 else 0.0
        print(f"{name[:48]:<48} {count:>8} {total:>10.3f} {1e3 * total / count:>10.2f} {share:>6.1f}%")
    if len(ranked) > args.top:
        rest = sum(total for _, (_, total) in ranked[args.top:])
        print(f"{f'({len(ranked) - args.top} more kernels)':<48} {'':>8} {rest:>10.3f}")


if __name__ == "__main__":
    main()
