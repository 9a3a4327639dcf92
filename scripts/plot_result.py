#!/usr/bin/python3
"""Plots the per-epoch curves of one or more training results into one PNG.

    /usr/bin/python3 scripts/plot_result.py runs/a.json runs/b.json --out curves.png
    /usr/bin/python3 scripts/plot_result.py fp32.json fp16.json --labels "fp32,fp16 static" \
        --title "cnn, Fashion-MNIST" --out curves.png

Each input is a result JSON of `gradscale train --result` (or of scripts/peer_torch.py --json) with a
`history` list of per-epoch objects {"epoch", "train_loss", "test_loss", "test_accuracy", "seconds",
"skipped_steps", "scale"} (and, optionally, "train_accuracy"). "skipped_steps" is cumulative at the
end of the epoch, as gradscale writes it; a count that goes down is read as per-epoch instead.
Panels: accuracy per epoch and loss per epoch, test solid with filled circles, train dashed with
open squares (train accuracy when the history has it); and, when any run's loss scale is not
constantly 1 or any step was skipped, the loss scale at the end of each epoch (log2 axis) with the
epochs that skipped steps marked and labelled with how many. One colour per run;
the label of a run is its file stem unless --labels gives them. Missing or null values (e.g. a
non-finite loss) leave gaps. The PNG is written atomically (temporary file, then rename), with
matplotlib's Agg backend, so no display is needed.
"""

import argparse
import json
import os
import sys

from atomic_file import atomic_open
from plot_values import PlotError, number, run_main


def load_run(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise PlotError("%s: cannot read (%s)" % (path, e.strerror or e))
    except ValueError as e:
        raise PlotError("%s: not valid JSON (%s)" % (path, e))
    if not isinstance(doc, dict):
        raise PlotError("%s: expected a JSON object at the top level" % path)
    history = doc.get("history")
    if not isinstance(history, list) or not history:
        raise PlotError("%s: no 'history' list of per-epoch results (a gradscale result JSON has "
                        "one per epoch)" % path)
    rows = []
    for i, h in enumerate(history):
        if not isinstance(h, dict):
            raise PlotError("%s: history[%d] is not an object" % (path, i))
        epoch = number(h.get("epoch"))
        rows.append({
            "epoch": epoch if epoch is not None else float(i + 1),
            "train_loss": number(h.get("train_loss")),
            "test_loss": number(h.get("test_loss")),
            "test_accuracy": number(h.get("test_accuracy")),
            "train_accuracy": number(h.get("train_accuracy")),
            "skipped_steps": number(h.get("skipped_steps")),
            "scale": number(h.get("scale")),
        })
    rows.sort(key=lambda r: r["epoch"])
    # Skipped steps per epoch from the cumulative counts (unless the counts are not cumulative).
    counts = [r["skipped_steps"] for r in rows]
    known = [c for c in counts if c is not None]
    cumulative = all(b >= a for a, b in zip(known, known[1:]))
    previous = 0.0
    for r in rows:
        c = r["skipped_steps"]
        r["skipped_in_epoch"] = None if c is None else (c - previous if cumulative else c)
        if c is not None:
            previous = c
    if all(r["test_accuracy"] is None for r in rows) and all(
            r["train_loss"] is None and r["test_loss"] is None for r in rows):
        raise PlotError("%s: the history has no test_accuracy, train_loss or test_loss values"
                        % path)
    return rows


def series(rows, key):
    """(xs, ys) with NaN for missing values, which matplotlib draws as gaps."""
    xs = [r["epoch"] for r in rows]
    ys = [float("nan") if r[key] is None else r[key] for r in rows]
    return xs, ys


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="plot_result.py",
        description="Plot accuracy and loss curves (per epoch) of gradscale result JSONs to a PNG.")
    p.add_argument("results", nargs="+", metavar="RESULT.json",
                   help="result JSON files with a 'history' list")
    p.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")
    p.add_argument("--labels", metavar="A,B,...",
                   help="comma-separated labels, one per result (default: the file stems)")
    p.add_argument("--title", help="figure title")
    p.add_argument("--dpi", type=int, default=120, help="resolution (default %(default)s)")
    a = p.parse_args(argv)
    if not a.out.lower().endswith(".png"):
        p.error("--out must name a .png file (got %r)" % a.out)
    if a.dpi < 10 or a.dpi > 1200:
        p.error("--dpi must be between 10 and 1200 (got %d)" % a.dpi)
    if a.labels is not None:
        labels = [s.strip() for s in a.labels.split(",")]
        if len(labels) != len(a.results):
            p.error("--labels has %d label%s for %d result file%s"
                    % (len(labels), "" if len(labels) == 1 else "s", len(a.results),
                       "" if len(a.results) == 1 else "s"))
        if any(not s for s in labels):
            p.error("--labels contains an empty label")
        a.labels = labels
    else:
        a.labels = [os.path.splitext(os.path.basename(r))[0] for r in a.results]
    return a


def main(argv):
    args = parse_args(argv)
    runs = [(label, load_run(path)) for label, path in zip(args.labels, args.results)]

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError as e:
        raise PlotError("matplotlib is not importable with %s (%s); run this script with "
                        "/usr/bin/python3 (Debian's python3-matplotlib)" % (sys.executable, e))

    show_scale = any(
        any(r["scale"] is not None and r["scale"] != 1.0 for r in rows)
        or any((r["skipped_steps"] or 0) > 0 for r in rows)
        for _, rows in runs)
    ncols = 3 if show_scale else 2
    fig, axes = plt.subplots(1, ncols, figsize=(5.2 * ncols, 4.2), squeeze=False)
    axes = axes[0]
    colours = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
    single_epoch = all(len(rows) == 1 for _, rows in runs)
    size = 6 if single_epoch else 4
    solid_style = {"marker": "o", "markersize": size}
    dashed_style = {"marker": "s", "markersize": size, "fillstyle": "none"}

    ax_acc, ax_loss = axes[0], axes[1]
    for i, (label, rows) in enumerate(runs):
        c = colours[i % len(colours)]
        xs, ys = series(rows, "test_accuracy")
        ax_acc.plot(xs, [y * 100.0 for y in ys], color=c, label=label, **solid_style)
        if any(r["train_accuracy"] is not None for r in rows):
            xs, ys = series(rows, "train_accuracy")
            ax_acc.plot(xs, [y * 100.0 for y in ys], color=c, linestyle="--", **dashed_style)
        xs, ys = series(rows, "train_loss")
        ax_loss.plot(xs, ys, color=c, linestyle="--", **dashed_style)
        xs, ys = series(rows, "test_loss")
        ax_loss.plot(xs, ys, color=c, linestyle="-", **solid_style)
    has_train_acc = any(r["train_accuracy"] is not None for _, rows in runs for r in rows)
    ax_acc.set_title("accuracy" if has_train_acc else "test accuracy")
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylabel("accuracy (%)")
    ax_loss.set_title("loss")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("cross-entropy")
    handles = [Line2D([], [], color=colours[i % len(colours)], label=label)
               for i, (label, _) in enumerate(runs)]
    handles += [Line2D([], [], color="grey", linestyle="-", label="test", **solid_style),
                Line2D([], [], color="grey", linestyle="--", label="train", **dashed_style)]
    ax_loss.legend(handles=handles, fontsize="small")
    if has_train_acc:
        ax_acc.legend(handles=handles, fontsize="small")
    else:
        ax_acc.legend(fontsize="small")

    if show_scale:
        ax_s = axes[2]
        for i, (label, rows) in enumerate(runs):
            c = colours[i % len(colours)]
            xs, ys = series(rows, "scale")
            ax_s.plot(xs, ys, color=c, label=label, **solid_style)
            for r in rows:
                if (r["skipped_in_epoch"] or 0) > 0 and r["scale"] is not None:
                    ax_s.scatter([r["epoch"]], [r["scale"]], marker="x", s=60, color=c, zorder=3)
                    ax_s.annotate("%d skipped" % int(r["skipped_in_epoch"]), (r["epoch"], r["scale"]),
                                  textcoords="offset points", xytext=(4, 6), fontsize="x-small",
                                  color=c)
        if any(r["scale"] is not None and r["scale"] > 0 for _, rows in runs for r in rows):
            ax_s.set_yscale("log", base=2)
        ax_s.margins(y=0.15)
        ax_s.set_title("loss scale at epoch end (x: epochs with skipped steps)")
        ax_s.set_xlabel("epoch")
        ax_s.set_ylabel("scale")
        ax_s.legend(fontsize="small")

    for ax in axes:
        ax.grid(True, alpha=0.3)
        if single_epoch:
            ax.set_xticks(sorted({r["epoch"] for _, rows in runs for r in rows}))
        else:
            ax.xaxis.get_major_locator().set_params(integer=True)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()

    out = os.path.abspath(args.out)
    try:
        with atomic_open(out, "wb") as f:
            fig.savefig(f, format="png", dpi=args.dpi)
    finally:
        plt.close(fig)
    print("plot_result.py: wrote %s (%d run%s)" % (args.out, len(runs), "" if len(runs) == 1
                                                     else "s"))
    return 0


if __name__ == "__main__":
    run_main(main, "plot_result.py")
