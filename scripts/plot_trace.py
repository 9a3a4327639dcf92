#!/usr/bin/python3
"""Plots a gradscale trace (schema gradscale.trace/1, docs/trace.md) into three PNGs.

    /usr/bin/python3 scripts/plot_trace.py runs/cnn.trace.json
    /usr/bin/python3 scripts/plot_trace.py runs/cnn.trace.jsonl --out runs/plots

TRACE is the .json document of a finished run or the .jsonl lines of a run that may have died (a cut
last line is dropped with a warning). Next to TRACE, or in --out DIR, it writes, for the stem of TRACE
(its name without .json/.jsonl):
  <stem>.scales.png     log2 S over the traced steps, one line per parametric layer (S: the
                        accumulated scale of the gradient the layer sends upstream; S_in for a layer
                        that sends none), and log2 S0, the scale at the loss (dashed);
  <stem>.underflow.png  heat map, layer x step, of the underflow rate of each layer's activation
                        gradient and of the loss gradient: underflow / (elements - zero - nonfinite),
                        on a log colour scale, over the steps with statistics (a notable step traced
                        without them is no column); a rate of exactly 0 has its own colour (white), a
                        layer with no activation gradient at that step is grey, and skipped (x) and
                        found_inf (red triangle) steps are marked under the step axis;
  <stem>.loss.png       the loss over the traced steps, skipped steps marked with a red x.
The title names the model, the format of forward values and the gradient format, and the scaler.
Each PNG is written atomically (temporary file, then rename) with matplotlib's Agg backend. The paths
written are printed, one per line. Needs Debian's python3-matplotlib (scripts/setup.sh installs it).
This script reads the trace; `gradscale inspect --check TRACE` validates it in full.
"""

import argparse
import json
import math
import os
import sys

from atomic_file import atomic_open
from plot_values import PlotError, number, run_main

SCHEMA = "gradscale.trace/1"


def read_lines(path, text):
    header, steps = None, []
    lines = [(i + 1, line) for i, line in enumerate(text.split("\n")) if line.strip()]
    if not lines:
        raise PlotError("%s: the trace is empty (no header line)" % path)
    for k, (number_, line) in enumerate(lines):
        try:
            obj = json.loads(line)
        except ValueError:
            if k == len(lines) - 1 and k > 0:
                print("plot_trace.py: warning: %s: line %d is not valid JSON (cut when the run died?) "
                      "and was ignored" % (path, number_), file=sys.stderr)
                break
            raise PlotError("%s: line %d: not valid JSON" % (path, number_))
        kind = obj.get("type") if isinstance(obj, dict) else None
        if k == 0:
            if kind != "header":
                raise PlotError("%s: line 1: the first line must be the header (found type %r)"
                                % (path, kind))
            header = obj
        elif kind == "step":
            steps.append(obj)
        elif kind != "summary":
            raise PlotError("%s: line %d: unknown type %r (allowed: header, step, summary)"
                            % (path, number_, kind))
    return header, steps


def load_trace(path):
    """(header, steps) of a trace file; raises PlotError with a one-line reason."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise PlotError("%s: cannot read (%s)" % (path, e.strerror or e))
    except UnicodeDecodeError:
        raise PlotError("%s: not a text file" % path)
    first = text.split("\n", 1)[0]
    try:
        first_obj = json.loads(first)
    except ValueError:
        first_obj = None
    if path.endswith(".jsonl") or (isinstance(first_obj, dict) and first_obj.get("type") == "header"):
        header, steps = read_lines(path, text)
    else:
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise PlotError("%s: not valid JSON (%s)" % (path, e))
        if not isinstance(doc, dict) or not isinstance(doc.get("header"), dict) \
                or not isinstance(doc.get("steps"), list):
            raise PlotError("%s: not a trace document (expected an object with 'header' and 'steps')"
                            % path)
        header, steps = doc["header"], doc["steps"]
    if header.get("schema") != SCHEMA:
        raise PlotError("%s: schema is %r, expected %r" % (path, header.get("schema"), SCHEMA))
    layers = header.get("layers")
    if not isinstance(layers, list) or not layers:
        raise PlotError("%s: the header has no 'layers' table" % path)
    for i, layer in enumerate(layers):
        if not isinstance(layer, dict) or layer.get("id") != i or not isinstance(layer.get("name"), str):
            raise PlotError("%s: header layers[%d] is not {\"id\": %d, \"name\": ...}" % (path, i, i))
    for i, st in enumerate(steps):
        if not isinstance(st, dict) or number(st.get("step")) is None or number(st.get("S0")) is None \
                or not isinstance(st.get("layers"), list) \
                or not isinstance(st.get("loss_grad", {}), dict):
            raise PlotError("%s: step record %d lacks step, S0, loss_grad or layers (run "
                            "`gradscale inspect --check` for the details)" % (path, i + 1))
        for entry in st["layers"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), int) \
                    or not 0 <= entry["id"] < len(layers):
                raise PlotError("%s: step %s has a layer entry whose id is not in the header's table"
                                % (path, st["step"]))
    if not steps:
        raise PlotError("%s: the trace has no step records to plot" % path)
    return header, steps


def underflow_rate(stats):
    """underflow / (elements - zero - nonfinite), 0 when that is 0; None without statistics."""
    if not isinstance(stats, dict):
        return None
    try:
        nonzero = stats["elements"] - stats["zero"] - stats["nonfinite"]
        return stats["underflow"] / nonzero if nonzero > 0 else 0.0
    except (KeyError, TypeError):
        raise PlotError("a statistics object lacks elements/zero/nonfinite/underflow counts")


def layers_sending_act(header, steps):
    """Per layer id: whether it sends an activation gradient upstream, i.e. has "act" in a record of a
    step with statistics ("stats" not false). A layer with no such record counts as sending one."""
    measured, sends = set(), set()
    for st in steps:
        if st.get("stats", True) is False:
            continue
        for entry in st["layers"]:
            measured.add(entry["id"])
            if "act" in entry:
                sends.add(entry["id"])
    return {layer["id"]: layer["id"] in sends or layer["id"] not in measured for layer in header["layers"]}


def record_scale(entry, sends_act):
    """The scale of the gradient a layer sends upstream: S, or S_in for a layer that sends none."""
    v = number(entry.get("S") if sends_act[entry["id"]] else entry.get("S_in"))
    return v if v is not None and v > 0 else None


def plot_scales(plt, header, steps, ax):
    xs = [st["step"] for st in steps]
    ax.plot(xs, [math.log2(st["S0"]) if st["S0"] > 0 else float("nan") for st in steps],
            color="black", linestyle="--", label="S0 (loss)")
    sends_act = layers_sending_act(header, steps)
    for layer in header["layers"]:
        if not layer.get("parametric"):
            continue
        px, py = [], []
        for st in steps:
            for entry in st["layers"]:
                if entry["id"] == layer["id"]:
                    s = record_scale(entry, sends_act)
                    px.append(st["step"])
                    py.append(math.log2(s) if s else float("nan"))
        if px:
            ax.plot(px, py, marker="." if len(px) < 50 else None, label=layer["name"])
    for st in steps:
        if st.get("found_inf"):
            ax.axvline(st["step"], color="red", alpha=0.25, linewidth=1)
    ax.set_xlabel("step")
    ax.set_ylabel("log2 S")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("accumulated scale per parametric layer (red lines: found_inf)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", ncol=2)


def plot_title(stem, header):
    """The figures' title: the run, its model, both formats (forward values and gradients) and the
    scaler, e.g. "run: cnn, fp16 / grad fp8_e5m2, scaler adaptive"."""
    forward = header.get("format", "?")
    grad = header.get("grad_format", forward)
    model = header.get("model") or (header.get("config") or {}).get("model", "?")  # the Model's name, else the config's
    return "%s: %s, %s / grad %s, scaler %s" % (stem, model, forward, grad, (header.get("scaler") or {}).get("policy", "?"))


def statistics_steps(steps):
    """The step records that carry statistics ("stats" absent or true): the heat map's columns. A
    notable step traced between samples ("stats": false) has none, and would only be a grey stripe."""
    return [st for st in steps if st.get("stats", True) is not False]


def event_steps(steps):
    """(skipped steps, found_inf steps), over every record, for the marks on the heat map's axis."""
    return ([st["step"] for st in steps if st.get("skipped")],
            [st["step"] for st in steps if st.get("found_inf")])


def plot_underflow(plt, header, all_steps, fig, ax):
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    steps = statistics_steps(all_steps)
    if not steps:
        ax.text(0.5, 0.5, "no step with statistics in this trace", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    rows = [("loss", [underflow_rate(st.get("loss_grad")) for st in steps])]
    for layer in header["layers"]:
        values = []
        for st in steps:
            v = None
            for entry in st["layers"]:
                if entry["id"] == layer["id"]:
                    v = underflow_rate(entry.get("act"))
            values.append(v)
        if any(v is not None for v in values):
            rows.append(("%d %s" % (layer["id"], layer["name"]), values))
    grid = np.array([[np.nan if v is None else v for v in values] for _, values in rows], dtype=float)
    positive = grid[np.isfinite(grid) & (grid > 0)]
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("lightgrey")  # no activation gradient at that step
    cmap.set_under("white")    # a rate of exactly 0
    if positive.size:
        vmin, vmax = float(positive.min()), float(positive.max())
        if vmax <= vmin:
            vmin, vmax = vmin / 2, vmax * 2
        norm = LogNorm(vmin=vmin, vmax=vmax, clip=False)
        # LogNorm treats 0 as invalid (grey); put zeros below vmin so they take the "under" colour.
        grid = np.where(grid == 0, vmin / 10, grid)
        label = "underflow rate (log scale)"
    else:
        norm = Normalize(vmin=0.0, vmax=1.0)
        grid = np.where(grid == 0, -1.0, grid)
        label = "underflow rate (none in this trace)"
    xs = np.array([st["step"] for st in steps], dtype=float)
    # Column edges halfway between traced steps, so the x axis is the true step number.
    mid = (xs[:-1] + xs[1:]) / 2
    edges = np.concatenate(([xs[0] - 0.5], mid, [xs[-1] + 0.5])) if len(xs) > 1 else \
        np.array([xs[0] - 0.5, xs[0] + 0.5])
    mesh = ax.pcolormesh(edges, np.arange(len(rows) + 1), np.ma.masked_invalid(grid), cmap=cmap,
                         norm=norm, shading="flat")
    bar = fig.colorbar(mesh, ax=ax, extend="min")
    bar.set_label(label)
    ax.set_yticks(np.arange(len(rows)) + 0.5)
    ax.set_yticklabels([name for name, _ in rows], fontsize="small")
    ax.invert_yaxis()
    # Skipped and overflowing steps (with statistics or not) as marks under the x axis.
    skipped, overflowed = event_steps(all_steps)
    marks = ax.get_xaxis_transform()  # x in steps, y in axes units
    if overflowed:
        ax.scatter(overflowed, [-0.02] * len(overflowed), transform=marks, marker="^", s=30, color="red",
                   clip_on=False, zorder=3, label="found_inf (%d)" % len(overflowed))
    if skipped:
        ax.scatter(skipped, [-0.02] * len(skipped), transform=marks, marker="x", s=30, color="black",
                   clip_on=False, zorder=4, label="skipped (%d)" % len(skipped))
    if skipped or overflowed:
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(0.0, -0.12), ncol=2, frameon=False)
    ax.set_xlabel("step (the steps with statistics)")
    ax.set_title("underflow rate of the gradient each layer sends upstream\n(white: 0, grey: none sent)",
                 fontsize="medium")
    ax.xaxis.get_major_locator().set_params(integer=True)


def plot_loss(plt, header, steps, ax):
    xs = [st["step"] for st in steps]
    ys = [number(st.get("loss")) for st in steps]
    ax.plot(xs, [float("nan") if y is None else y for y in ys], marker="." if len(xs) < 200 else None,
            label="loss")
    known = [y for y in ys if y is not None]
    floor = min(known) if known else 0.0
    sx, sy = [], []
    for x, y, st in zip(xs, ys, steps):
        if st.get("skipped"):
            sx.append(x)
            sy.append(y if y is not None else floor)
    if sx:
        ax.scatter(sx, sy, marker="x", s=60, color="red", zorder=3, label="skipped step (%d)" % len(sx))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title("loss over the traced steps")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")


def stem_of(path):
    name = os.path.basename(path)
    for ext in (".jsonl", ".json"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="plot_trace.py",
        description="Plot a gradscale trace (.json or .jsonl): per-layer scales, underflow heat map, "
                    "loss.")
    p.add_argument("trace", metavar="TRACE", help="TRACE.json or TRACE.jsonl")
    p.add_argument("--out", metavar="DIR", help="directory for the PNGs (default: next to TRACE)")
    p.add_argument("--dpi", type=int, default=120, help="resolution (default %(default)s)")
    a = p.parse_args(argv)
    if a.dpi < 10 or a.dpi > 1200:
        p.error("--dpi must be between 10 and 1200 (got %d)" % a.dpi)
    return a


def main(argv):
    args = parse_args(argv)
    header, steps = load_trace(args.trace)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise PlotError("matplotlib is not importable with %s (%s); run this script with "
                        "/usr/bin/python3 (Debian's python3-matplotlib)" % (sys.executable, e))
    out_dir = args.out if args.out else os.path.dirname(os.path.abspath(args.trace))
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise PlotError("--out %s: exists and is not a directory" % out_dir)
    stem = stem_of(args.trace)
    title = plot_title(stem, header)
    n_rows = 1 + sum(1 for layer in header["layers"])
    figures = [
        ("scales", (8, 4.5), lambda fig, ax: plot_scales(plt, header, steps, ax)),
        ("underflow", (9, max(3.0, 0.35 * n_rows + 1.5)),
         lambda fig, ax: plot_underflow(plt, header, steps, fig, ax)),
        ("loss", (8, 4), lambda fig, ax: plot_loss(plt, header, steps, ax)),
    ]
    written = []
    for name, size, draw in figures:
        fig, ax = plt.subplots(figsize=size)
        try:
            draw(fig, ax)
            fig.suptitle(title, fontsize="small")
            fig.tight_layout()
            path = os.path.join(out_dir, "%s.%s.png" % (stem, name))
            try:
                with atomic_open(path, "wb") as f:
                    fig.savefig(f, format="png", dpi=args.dpi)
            except OSError as e:
                raise PlotError("%s: cannot write (%s)" % (path, e.strerror or e))
        finally:
            plt.close(fig)
        written.append(path)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    run_main(main, "plot_trace.py")
