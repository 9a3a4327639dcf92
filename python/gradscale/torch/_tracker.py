"""The plug-in's graph side for a Scaler's lifetime (`Tracker`): the core and the layer table the
autograd Functions reach through it, the backward pass that runs now (`_backward_pass.BackwardPass`,
one per `scaler.scale(loss)`), and the layer graph the passes' walks have learned so far.
"""
from __future__ import annotations

import weakref
from typing import Dict, List, Optional, Tuple

import torch

from ._backward_pass import BackwardPass
from ._functions import is_dense, round_forward
from ._layers import Layer


class Buffers:
    """Tensors kept for reuse on the CPU: a parameter's working copies, or its weight gradients.
    glibc gives freed memory at the top of its heap back to the system once it exceeds a threshold
    that adapts to the sizes freed; a copy of the model's size taken and freed every step crosses it,
    and the pages are faulted in again the next step (thousands a step, milliseconds).
    Each buffer is handed out as an alias, a tensor of its own on the buffer's memory, and written
    again only when that alias is gone: no graph, hook, `.grad` or user holds it any more."""

    LIMIT = 4  # buffers at most (a layer called several times a step, a graph kept alive)

    def __init__(self):
        # [buffer, the alias last handed out (weakly), its sizes, its strides, its dtype]
        self._slots: List[list] = []

    def take(self, like: torch.Tensor) -> torch.Tensor:
        """An alias of a free buffer with `like`'s sizes, strides and dtype on the CPU (contents
        undefined): a kept one when one is free, else a new one, kept while fewer than LIMIT are."""
        shape, strides, dtype = like.shape, like.stride(), like.dtype
        free = None
        for slot in self._slots:
            if slot[1]() is not None:
                continue  # in use
            if slot[2] == shape and slot[3] == strides and slot[4] is dtype:
                alias = slot[0].detach()
                slot[1] = weakref.ref(alias)
                return alias
            free = slot  # another shape (a parameter resized): replaced when no slot fits
        buf = torch.empty_strided(shape, strides, dtype=dtype, device="cpu")
        alias = buf.detach()
        if free is not None:
            free[:] = [buf, weakref.ref(alias), shape, strides, dtype]
        elif len(self._slots) < self.LIMIT:
            self._slots.append([buf, weakref.ref(alias), shape, strides, dtype])
        return alias


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
        # Each parameter's kept buffers on the CPU (Buffers, for its working copies and for its weight
        # gradients), while the parameter lives: id(master) → (the master, weakly; the two Buffers).
        self._buffers: Dict[int, tuple] = {}
        # Host memory for the rounded copies and gradients a step makes on the CPU (a _core.HostPool, set
        # by the Scaler for the CPU core; None elsewhere): `_functions.new_like`.
        self.pool = None

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
        """Notes a layer output just rounded to `format`; returns it. Not an inference tensor
        (torch.inference_mode): it has no version counter to tell a later in-place change by."""
        if t.is_inference():
            return t
        key = id(t)
        rounded = self._rounded
        rounded[key] = (weakref.ref(t, lambda _, key=key: rounded.pop(key, None)), t._version)
        return t

    def is_rounded(self, t: torch.Tensor) -> bool:
        """Whether `t` is a layer output this Scaler rounded to `format`, not modified in place since
        (its values are values of `format`: rounding them again is the identity)."""
        entry = self._rounded.get(id(t))
        return entry is not None and entry[0]() is t and entry[1] == t._version

    def buffers(self, master: torch.Tensor) -> Optional[Tuple["Buffers", "Buffers"]]:
        """The kept buffers of a parameter's working copies and weight gradients; None off the CPU
        (CUDA's caching allocator keeps freed memory: nothing to gain) and for a master that is not
        dense."""
        if not master.is_cpu or not is_dense(master):
            return None
        key = id(master)
        entry = self._buffers.get(key)
        if entry is None or entry[0]() is not master:
            kept = self._buffers
            entry = (weakref.ref(master, lambda _, key=key: kept.pop(key, None)), Buffers(), Buffers())
            kept[key] = entry
        return entry[1], entry[2]

    def working_copy(self, master: torch.Tensor, buffers: Optional[Tuple["Buffers", "Buffers"]]) -> torch.Tensor:
        """`master` rounded to `format`: the copy a layer call computes with, in one of `buffers` (the
        parameter's kept buffers, `buffers(master)`) when given, else in a new tensor. The same values
        either way."""
        if buffers is None:
            return round_forward(master, self.format, self.core)
        copy = buffers[0].take(master)
        if self.format == "fp32":
            with torch.no_grad():
                copy.copy_(master)
        elif copy.numel():
            # The same sizes and strides: numel() values in the same order from both addresses.
            self.core.quantize_into(master.data_ptr(), copy.data_ptr(), copy.numel(), self.format)
        return copy

    def release_buffers(self) -> None:
        """Lets go of the kept buffers and of the pool (Scaler.remove()): the pool's free blocks go back
        to the system now, those torch still holds when torch frees them."""
        self._buffers.clear()
        self.pool = None

    # ---- what the Functions call ---------------------------------------------------------------
    def running(self) -> Optional[BackwardPass]:
        run = self.current
        return run if run is not None and run.state == "running" else None

    def loss_backward(self, ctx, g: torch.Tensor) -> torch.Tensor:
        run = self.current
        if run is None or run.state not in ("ready", "running") or not run.walked(ctx):
            raise RuntimeError("gradscale.torch: backward through a model with a gradscale Scaler must start "
                               "from scaler.scale(loss) (call scaler.scale(loss).backward(); a second backward "
                               "over a retained graph needs its own scaler.scale(...); a loss that reads the "
                               "outputs of two models with a Scaler each, as a GAN's generator loss reads the "
                               "discriminator's, needs one Scaler over a module whose forward runs both)")
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
