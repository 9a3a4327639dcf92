"""The per-layer trace of SPEC §8 that `Scaler(trace=...)` writes: the CLI's writer (the core's TraceWriter),
so `gradscale inspect` and scripts/plot_trace.py read it — a header with the plug-in's configuration and
layer table, a line per traced step (every skipped or overflowing step among them), and the summary of
`scaler.close()`.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Optional

import torch
from torch import nn

from ._layers import trace_table


class Trace:
    """An open trace: its writer and the counts of skipped and overflowing steps for its summary."""

    def __init__(self, core_module, core, trace: Any, model: nn.Module, layers, every: int, histograms: bool):
        base = check_trace_path(trace)
        # The header gradscale train writes (the core's make_trace_header: formats, scaler, "model"), with
        # the plug-in's run description and the layer table it learns from the model.
        run = {"model": type(model).__name__, "writer": "gradscale.torch", "torch": torch.__version__}
        header = core.trace_header(json.dumps(run), int(torch.initial_seed()), json.dumps(trace_table(layers, model)))
        self.writer = core_module.TraceWriter(base, header, every, histograms)
        self.counts = {"skipped": 0, "overflows": 0}  # every such step is traced

    @property
    def paths(self) -> tuple:
        return (self.writer.jsonl_path, self.writer.json_path)

    def samples(self, step: int) -> bool:
        """Whether `step` takes full statistics for the trace."""
        return self.writer.samples(step)

    def write_step(self, core, result: dict) -> None:
        """The step's line, from the core's records and its verdict (finish_step's result)."""
        self.writer.write_step(core, result["step"], 1, result["loss"], result["loss_scale"], result["phi"],
                               result["skipped"])
        self.counts["skipped"] += int(result["skipped"])
        self.counts["overflows"] += int(result["found_inf"])

    def finish(self, results: Dict[str, Optional[float]], last: Optional[dict], steps: int, wall_seconds: float,
               scaler_seconds: float) -> None:
        """The summary line and `trace`.json; `results` as close() takes them."""
        allowed = {"train_loss", "train_accuracy", "test_loss", "test_accuracy"}
        unknown = set(results) - allowed
        if unknown:
            raise ValueError(f"gradscale.torch: close() takes {sorted(allowed)}, got {sorted(unknown)}")
        summary = {key: results.get(key) for key in sorted(allowed)}
        if summary["train_loss"] is None and last is not None:
            summary["train_loss"] = last["loss"]
        summary.update(self.counts)
        summary.update({"steps": steps, "wall_seconds": wall_seconds, "scaler_seconds": scaler_seconds})
        # A NaN loss (the step that overflowed) is null in JSON.
        self.writer.finish(json.dumps({k: _finite_or_none(v) for k, v in summary.items()}, allow_nan=False))


def check_trace_path(trace: Any) -> str:
    """The trace's base path, checked as strictly as the CLI's outputs: a file name (not a directory,
    not '.'), and no existing file it would replace other than an earlier gradscale trace."""
    if not isinstance(trace, (str, os.PathLike)):
        raise TypeError(f"gradscale.torch: Scaler(trace=...) takes a path, got {type(trace).__name__}")
    base = os.fspath(trace)
    name = os.path.basename(base)
    if not base or base.endswith(os.sep) or name in ("", ".", "..") or os.path.isdir(base):
        raise ValueError(f"gradscale.torch: Scaler(trace={base!r}) must name a file (the trace is written to "
                         f"<trace>.jsonl and <trace>.json), not a directory")
    for path in (base + ".jsonl", base + ".json"):
        if os.path.isdir(path):
            raise ValueError(f"gradscale.torch: Scaler(trace={base!r}) would write {path}, which is a directory")
        if os.path.exists(path):
            with open(path, "rb") as f:
                head = f.read(4096)
            if b"gradscale.trace" not in head:
                raise ValueError(f"gradscale.torch: Scaler(trace={base!r}) would replace {path}, which is not a "
                                 "gradscale trace; choose another trace name")
    return base


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
