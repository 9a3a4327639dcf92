#!/usr/bin/python3
"""Plots the table of a `gradscale ablate` run as grouped bars with error bars, one panel per metric.

    /usr/bin/python3 scripts/plot_ablation.py runs/quick/table.csv --out runs/quick/table.png
    /usr/bin/python3 scripts/plot_ablation.py table.csv --out acc.png --metrics final_accuracy,mean_underflow
    /usr/bin/python3 scripts/plot_ablation.py table.csv --out t.png --trace-plots runs/quick/runs

TABLE is the table.csv that `gradscale ablate` writes: first the configuration columns (the variant,
then the axes other than the seed), then `runs,done,diverged,failed,missing`, then `<metric>_mean` and
`<metric>_std` for each metric (mean and sample standard deviation over the seeds; empty when no run of
the configuration finished). The last configuration column gives the bars (one colour each, in the
legend); the other columns, joined with " / ", give the groups along the x axis. The error bars are
one standard deviation. A configuration with no finished run has no bar and is marked "n/a" (its
runs diverged or failed: the table says which). Underflow rates are shown in percent. The accuracy
panels zoom the y axis onto the bars (it does not start at 0, and the panel title says so). The steps
to target panel shows the mean over the runs that reached the target; where some did not, the bar is
marked "k/n reached" (no bar when none did). Panels without a value in any row (no fp32 shadow, no
target) are left out.

--trace-plots RUNS_DIR also plots each run's trace (RUNS_DIR/<run>/trace.json) with scripts/plot_trace.py
when that script is in this directory, in this one process (one matplotlib start), skipping traces
whose plots are newer than the trace.

The PNG is written atomically with matplotlib's Agg backend (no display needed). Needs Debian's
python3-matplotlib.
"""

import argparse
import contextlib
import csv
import io
import math
import os
import sys

from atomic_file import atomic_open

METRICS = {  # key: (panel title, scale of the shown numbers)
    "final_accuracy": ("final test accuracy", 1.0),
    "best_accuracy": ("best test accuracy", 1.0),
    "skipped_steps": ("skipped steps", 1.0),
    "mean_underflow": ("mean per-layer underflow rate (%)", 100.0),
    "max_underflow": ("max per-layer underflow rate (%)", 100.0),
    "ms_per_step": ("time per step (ms)", 1.0),
    "scaler_percent": ("time in the scaler (% of training)", 1.0),
    "shadow_rel_error": ("upstream gradient: relative error against the fp32 shadow", 1.0),
    "shadow_underflow_mass": ("upstream gradient: underflowed mass (%, fp32 shadow)", 100.0),
    "steps_to_target": ("steps to the target accuracy (runs that reached it)", 1.0),
}
DEFAULT_METRICS = ("final_accuracy,steps_to_target,mean_underflow,max_underflow,shadow_rel_error,"
                   "shadow_underflow_mass,skipped_steps,ms_per_step,scaler_percent")
FIXED_COLUMNS = ["runs", "done", "diverged", "failed", "missing"]


class PlotError(Exception):
    pass


def number(text):
    """A CSV cell as a finite float, or None."""
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_table(path):
    """Returns (configuration columns, rows); each row: {"labels": [...], "<metric>": (mean, std)}."""
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            body = list(reader)
    except OSError as e:
        raise PlotError("%s: cannot read (%s)" % (path, e.strerror or e))
    if not header or "runs" not in header:
        raise PlotError("%s: not a gradscale ablation table (no 'runs' column in the header)" % path)
    n_config = header.index("runs")
    if header[n_config:n_config + len(FIXED_COLUMNS)] != FIXED_COLUMNS:
        raise PlotError("%s: expected the columns %s after the configuration columns" % (path, ",".join(FIXED_COLUMNS)))
    rows = []
    for i, cells in enumerate(body):
        if len(cells) != len(header):
            raise PlotError("%s: line %d has %d fields, the header %d" % (path, i + 2, len(cells), len(header)))
        row = {"labels": cells[:n_config]}
        for key in METRICS:
            if key + "_mean" in header:
                row[key] = (number(cells[header.index(key + "_mean")]), number(cells[header.index(key + "_std")]))
        for key in ("steps_to_target_reached", "steps_to_target_runs"):
            if key in header:
                row[key] = number(cells[header.index(key)])
        rows.append(row)
    if not rows:
        raise PlotError("%s: the table has no rows" % path)
    return header[:n_config], rows


def plot(columns, rows, metrics, out, title, dpi):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Groups along x from all but the last column; bars within a group from the last column.
    def group_of(r):
        return " / ".join(r["labels"][:-1]) if len(columns) > 1 else ""

    def bar_of(r):
        return r["labels"][-1] if columns else "all"

    groups, bars = [], []
    for r in rows:
        if group_of(r) not in groups:
            groups.append(group_of(r))
        if bar_of(r) not in bars:
            bars.append(bar_of(r))
    cell = {(group_of(r), bar_of(r)): r for r in rows}
    # Within a group, only the bars it has, centred: a column that does not apply to a group (a global
    # scaler's "bounds" of "-") leaves no gaps.
    present = {group: [bar for bar in bars if (group, bar) in cell] for group in groups}
    slots = max(len(v) for v in present.values())
    metrics = [m for m in metrics if any(r.get(m, (None, None))[0] is not None for r in rows)]
    if not metrics:
        raise PlotError("no metric has a value in the table: did any run finish?")

    width = 0.8 / slots
    # A group's label on one line per column (model, format, scaler …), and each group as wide as its
    # bars or its longest line (about 0.07 inch a character at 8 pt), so neighbours never overlap.
    tick_labels = [g.replace(" / ", "\n") for g in groups]
    longest = max((len(line) for g in tick_labels for line in g.split("\n")), default=0)
    group_w = max(slots * 0.28, longest * 0.07 + 0.1) if len(columns) > 1 else slots * 0.28
    fig_w = max(6.0, 0.9 + len(groups) * group_w + 1.5)
    fig, axes = plt.subplots(len(metrics), 1, figsize=(fig_w, 2.3 * len(metrics) + 0.8), squeeze=False)
    cmap = plt.get_cmap("tab10" if len(bars) <= 10 else "tab20")
    for ax, m in zip(axes[:, 0], metrics):
        label, scale = METRICS[m]
        lows, highs = [], []
        for b, bar in enumerate(bars):
            xs, ys, es, missing = [], [], [], []
            for g, group in enumerate(groups):
                r = cell.get((group, bar))
                if r is None:
                    continue
                x = g + (present[group].index(bar) - (len(present[group]) - 1) / 2.0) * width
                mean, std = r.get(m, (None, None))
                reached, runs = r.get("steps_to_target_reached"), r.get("steps_to_target_runs")
                if m == "steps_to_target" and runs and reached is not None and reached < runs:
                    # Runs that never reached the target have no step: the bar is of those that did.
                    ax.text(x, 0.97 if mean is None else 0.03, "%d/%d reached" % (reached, runs), rotation=90,
                            transform=ax.get_xaxis_transform(), ha="center", va="top" if mean is None else "bottom",
                            fontsize=7, color="firebrick", zorder=5)
                if mean is None:
                    if not (m == "steps_to_target" and runs):
                        missing.append(x)
                    continue
                xs.append(x)
                ys.append(mean * scale)
                es.append((std or 0.0) * scale)
                lows.append((mean - (std or 0.0)) * scale)
                highs.append((mean + (std or 0.0)) * scale)
            ax.bar(xs, ys, width * 0.92, yerr=es, capsize=2, color=cmap(b % cmap.N), label=bar,
                   error_kw={"elinewidth": 0.8})
            for x in missing:
                ax.text(x, 0.03, "n/a", transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                        va="bottom", fontsize=7, color="0.4")
        zoomed = m.endswith("accuracy") and lows
        if zoomed:
            lo, hi = min(lows), max(highs)
            pad = max(0.02, 0.15 * (hi - lo))
            ax.set_ylim(max(0.0, lo - pad), min(1.0, hi + pad / 2) if hi <= 1.0 else hi + pad / 2)
        ax.set_title(label + (" (y axis zoomed)" if zoomed else ""), fontsize=9)
        ax.set_xlim(-0.5, len(groups) - 0.5)  # the same x range in every panel, bars or not
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(tick_labels if len(columns) > 1 else [""] * len(groups), fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        ax.tick_params(axis="y", labelsize=8)
    if len(columns) > 1:
        axes[-1, 0].set_xlabel(" / ".join(columns[:-1]), fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.3 / fig.get_size_inches()[1]),
               ncol=min(len(bars), 6), fontsize=8,
               title=columns[-1] if columns else None, title_fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10, y=0.995)
    # Room at the top for the title and the legend (about 0.3 inch each legend row).
    fig_h = fig.get_size_inches()[1]
    legend_rows = 1 + (len(bars) - 1) // 6
    fig.tight_layout(rect=(0, 0, 1, 1 - (0.35 + 0.3 * legend_rows) / fig_h))
    with atomic_open(out, "wb") as f:
        fig.savefig(f, format="png", dpi=dpi)
    plt.close(fig)


def plot_traces(runs_dir):
    """Runs plot_trace.py's main() on every run's trace; returns (plotted, up to date, failed)."""
    here = os.path.dirname(os.path.abspath(__file__))
    if not os.path.exists(os.path.join(here, "plot_trace.py")):
        print("plot_ablation.py: scripts/plot_trace.py is not in this tree: no per-run trace plots", file=sys.stderr)
        return 0, 0, 0
    sys.path.insert(0, here)
    import plot_trace

    done = fresh = failed = 0
    for name in sorted(os.listdir(runs_dir)):
        run = os.path.join(runs_dir, name)
        trace = os.path.join(run, "trace.json")
        if not os.path.exists(trace):
            continue
        pngs = [os.path.join(run, "trace.%s.png" % k) for k in ("scales", "underflow", "loss")]
        if all(os.path.exists(p) and os.path.getmtime(p) >= os.path.getmtime(trace) for p in pngs):
            fresh += 1
            continue
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                status = plot_trace.main([trace, "--out", run])
            if status not in (None, 0):
                raise RuntimeError("exit %s" % status)
            done += 1
        except (Exception, SystemExit) as e:  # one bad trace must not stop the others
            failed += 1
            print("plot_ablation.py: %s: plot_trace.py failed (%s)" % (trace, e), file=sys.stderr)
    return done, fresh, failed


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("table", metavar="TABLE", help="table.csv of gradscale ablate")
    p.add_argument("--out", required=True, metavar="PNG", help="the PNG to write")
    p.add_argument("--metrics", default=DEFAULT_METRICS,
                   help="comma-separated panels, from: %s (default: %%(default)s)" % ", ".join(METRICS))
    p.add_argument("--title", default=None, help="figure title (default: the table's directory name)")
    p.add_argument("--dpi", type=int, default=110, help="resolution (default %(default)s)")
    p.add_argument("--trace-plots", metavar="RUNS_DIR", help="also plot every run's trace with plot_trace.py")
    a = p.parse_args(argv)
    a.metrics = [m.strip() for m in a.metrics.split(",") if m.strip()]
    for m in a.metrics:
        if m not in METRICS:
            p.error("unknown metric '%s' (allowed: %s)" % (m, ", ".join(METRICS)))
    if a.dpi < 10 or a.dpi > 1200:
        p.error("--dpi must be in [10, 1200]")
    return a


def main(argv):
    args = parse_args(argv)
    try:
        columns, rows = read_table(args.table)
        title = args.title
        if title is None:
            title = os.path.basename(os.path.dirname(os.path.abspath(args.table)))
        plot(columns, rows, args.metrics, args.out, title, args.dpi)
        print(args.out)
        if args.trace_plots:
            done, fresh, failed = plot_traces(args.trace_plots)
            print("plot_ablation.py: trace plots: %d made, %d up to date, %d failed" % (done, fresh, failed),
                  file=sys.stderr)
    except PlotError as e:
        print("plot_ablation.py: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
