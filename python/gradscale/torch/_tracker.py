"""The plug-in's graph side for a Scaler's lifetime (`Tracker`): the core and the layer table the
autograd Functions reach through it, the backward pass that runs now (`_backward_pass.BackwardPass`,
one per `scaler.scale(loss)`), and the layer graph the passes' walks have learned so far.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import torch

from ._backward_pass import BackwardPass
from ._layers import Layer


class Tracker:
    """The plug-in's graph side for the Scaler's lifetime: the core, the layer table, the pass that
    runs, what the walks learned of the layer graph, and the counters the tests read."""

    def __init__(self, core, layers: List[Layer], fmt: str):
        self.core = core
        self.layers = layers
        self.format = fmt
        self.current: Optional[BackwardPass] = None
        self._joins = 0  # joins whose parts arrived at different scales, since the Scaler was made
        self._join_scales: List[List[int]] = []  # the scale handles of joins not yet counted
        # The layer graph (LayerInfo::inputs: which layers' outputs each layer reads; the model's input
        # is not listed), gathered from every pass so far; `graph_grew` until the core was given it.
        self.layer_inputs: List[set] = [set() for _ in layers]
        self.graph_grew = False
        # Set by the Scaler: called with the pass when its first LossEdge backward runs, and when done.
        self.on_start = None
        self.on_done = None
        # The step's fp32 shadow (Scaler(shadow=True), _shadow.Shadow), on steps with statistics.
        self.shadow = None
        # Whether layer calls substitute working copies (any emulation, or a shadow to compare with).
        self.substitute = fmt != "fp32"
        # Layer outputs this Scaler rounded to `format` (Exit), while they live: id → (the tensor, weakly;
        # its version then). One read by the next layer untouched needs no second rounding.
        self._rounded: Dict[int, Tuple[weakref.ref, int]] = {}

    # ---- the joins the tests count -------------------------------------------------------------
    def note_join(self, scales: List[int]) -> None:
        """A join of parts at these scale handles (counted by `joins` without reading them now: on a
        device their values may be the device's still)."""
        self._join_scales.append(scales)

    def count_joins(self) -> None:
        """Counts the noted joins, while their handles last (before the core's next begin_step)."""
        noted, self._join_scales = self._join_scales, []
        for scales in noted:
            if len({self.core.scale_value(h) for h in scales}) > 1:
                self._joins += 1

    @property
    def joins(self) -> int:
        """Joins whose parts arrived at different scales, since the Scaler was made."""
        self.count_joins()
        return self._joins

    # ---- forward values ------------------------------------------------------------------------
    def note_rounded(self, t: torch.Tensor) -> torch.Tensor:
        """Notes a layer output just rounded to `format`; returns it."""
        key = id(t)
        rounded = self._rounded
        rounded[key] = (weakref.ref(t, lambda _, key=key: rounded.pop(key, None)), t._version)
        return t

    def is_rounded(self, t: torch.Tensor) -> bool:
        """Whether `t` is a layer output this Scaler rounded to `format`, not modified in place since
        (its values are values of `format`: rounding them again is the identity)."""
        entry = self._rounded.get(id(t))
        return entry is not None and entry[0]() is t and entry[1] == t._version

    # ---- what the Functions call ---------------------------------------------------------------
    def running(self) -> Optional[BackwardPass]:
        run = self.current
        return run if run is not None and run.state == "running" else None

    def loss_backward(self, ctx, g: torch.Tensor) -> torch.Tensor:
        run = self.current
        if run is None or run.state not in ("ready", "running") or not run.walked(ctx):
            raise RuntimeError("gradscale.torch: backward through a model with a gradscale Scaler must start "
                               "from scaler.scale(loss) (call scaler.scale(loss).backward(); a second backward "
                               "over a retained graph needs its own scaler.scale(...))")
        if run.state == "ready":
            run.start()
        return run.loss_backward(ctx, g)

    # ---- passes ------------------------------------------------------------------------------
    def new_pass(self, root) -> BackwardPass:
        """The pass of a loss (scale()): the ready pass of this root when there is one (scale() twice
        on one loss), else a new one, which replaces a ready pass that never ran (an abandoned
        scale())."""
        run = self.current
        if run is not None and run.state == "ready":
            if run.root_is(root):
                return run
            run.close("abandoned")
        run = BackwardPass(self, [root])
        self.current = run
        return run

    def stale(self) -> Optional[BackwardPass]:
        """The current pass when it is still running between public calls: its backward raised."""
        run = self.current
        if run is not None and run.state == "running":
            run.close("failed")
            return run
        return None

    def learn(self, run: BackwardPass) -> None:
        for layer_id, sources in run.layer_edges.items():
            new = sources - self.layer_inputs[layer_id]
            if new:
                self.layer_inputs[layer_id] |= new
                self.graph_grew = True

    def take_layer_graph(self) -> Optional[List[List[int]]]:
        """The layer graph, when it grew since it was last taken (else None)."""
        if not self.graph_grew:
            return None
        self.graph_grew = False
        return [sorted(ids) for ids in self.layer_inputs]
