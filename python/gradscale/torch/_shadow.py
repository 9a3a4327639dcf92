"""What precision costs each layer: an fp32 shadow of the backward pass (Scaler(shadow=True)).

On a step with statistics, before the step's first backward pass, the same graph is differentiated
once more with nothing rounded and nothing scaled (every boundary Function passes its gradient on, the
loss gradient at scale 1): the fp32 gradient each layer sends upstream and each weight-gradient part,
from the same forward values. The low-precision pass that follows compares its own values, divided
by their scales, with them, per layer:

- `underflow_mass`: Σ|g| over the values that rounded to zero, over Σ|g| (g the fp32 values just
  before their rounding, at their scale: a ratio, so the scale cancels) — what underflow took, not only
  how many values;
- `rel_error`: ‖g_lp/S − g_fp32‖ / ‖g_fp32‖ — every rounding upstream of the layer included;
- `cosine`: the cosine between g_lp/S and g_fp32.

for the gradient a layer sends upstream ("upstream") and for its weight-gradient parts ("weight"),
summed over the layer's calls. Norms and dot products in float64.
"""
from __future__ import annotations

import math
from typing import Dict, Optional, Tuple

import torch


class _Sums:
    __slots__ = ("lost", "total", "diff2", "ref2", "lp2", "dot")

    def __init__(self):
        self.lost = self.total = self.diff2 = self.ref2 = self.lp2 = self.dot = 0.0

    def add(self, pre: torch.Tensor, rounded: torch.Tensor, lp: torch.Tensor, ref: torch.Tensor) -> None:
        """pre: the fp32 values before rounding (any scale); rounded: after; lp: the values divided by
        their scale; ref: the shadow's fp32 values."""
        size = pre.detach().double().abs()
        lost = (rounded.detach() == 0) & (size != 0)
        # The total as the lost part plus the rest: two sums over the same values in different orders
        # may differ in the last bit, and a share above 1 is no share.
        lost_mass = float(size[lost].sum())
        self.lost += lost_mass
        self.total += lost_mass + float(size[~lost].sum())
        lp = lp.detach().double().reshape(-1)
        ref = ref.detach().double().reshape(-1)
        self.diff2 += float((lp - ref).pow(2).sum())
        self.ref2 += float(ref.pow(2).sum())
        self.lp2 += float(lp.pow(2).sum())
        self.dot += float((lp * ref).sum())

    def metrics(self) -> dict:
        norm = math.sqrt(self.ref2)
        both = math.sqrt(self.ref2 * self.lp2)
        return {"underflow_mass": self.lost / self.total if self.total > 0 else 0.0,
                "rel_error": math.sqrt(self.diff2) / norm if norm > 0 else (0.0 if self.diff2 == 0 else math.inf),
                "cosine": self.dot / both if both > 0 else (1.0 if self.diff2 == 0 else 0.0)}


class Shadow:
    """One step's shadow: the fp32 values the shadow pass recorded, and the comparison sums."""

    def __init__(self):
        self.recording = False  # the shadow pass runs
        self._upstream: Dict[object, torch.Tensor] = {}  # LayerCall -> fp32 upstream gradient
        self._weight: Dict[Tuple[object, int], torch.Tensor] = {}  # (call key, layer) -> fp32 part
        self._sums: Dict[Tuple[int, str], _Sums] = {}

    def record_upstream(self, call, g: torch.Tensor) -> None:
        self._upstream[call] = g.detach().clone()

    def record_weight(self, key, g: torch.Tensor) -> None:
        part = g.detach()
        part = part.to_dense() if part.is_sparse else part.clone()
        self._weight[key] = part + self._weight[key] if key in self._weight else part

    def compare_upstream(self, layer: int, call, pre: torch.Tensor, rounded: torch.Tensor, scale: float) -> None:
        ref = self._upstream.pop(call, None)
        if ref is not None and ref.shape == rounded.shape:
            self._sums.setdefault((layer, "upstream"), _Sums()).add(pre, rounded, rounded / scale, ref)

    def compare_weight(self, layer: int, key, pre: torch.Tensor, true: torch.Tensor) -> None:
        ref = self._weight.pop(key, None)
        if ref is None or pre.is_sparse:
            return
        if ref.shape == true.shape:
            self._sums.setdefault((layer, "weight"), _Sums()).add(pre, true, true, ref)

    def rows(self, layers: int) -> Dict[int, Optional[dict]]:
        out: Dict[int, Optional[dict]] = {}
        for layer in range(layers):
            found = {kind: self._sums[(layer, kind)].metrics() for kind in ("upstream", "weight")
                     if (layer, kind) in self._sums}
            out[layer] = found or None
        return out


def run_shadow(tracker, model: torch.nn.Module, loss: torch.Tensor) -> None:
    """The step's fp32 shadow: the graph of `loss` differentiated with nothing rounded or scaled, before the
    step's first low-precision pass compares with it (the tracker holds it until the verdict)."""
    shadow = Shadow()
    tracker.shadow = shadow
    shadow.recording = True
    try:
        params = [p for p in model.parameters() if p.requires_grad]
        torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    finally:
        shadow.recording = False


def take_shadow(tracker, core, layers: int) -> Dict[int, Optional[dict]]:
    """The step's shadow figures per layer (for layer_scales()), noted in the core's records (so in the
    trace); {} on a step without a shadow."""
    if tracker.shadow is None:
        return {}
    rows = tracker.shadow.rows(layers)
    tracker.shadow = None
    for layer, row in rows.items():
        for kind, m in (row or {}).items():
            core.note_shadow(layer, kind == "weight", m["underflow_mass"], m["rel_error"], m["cosine"])
    return rows
