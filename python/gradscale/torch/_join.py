"""SPEC §5's join in the plug-in: the parts (g_i, S_i) of the gradient of one node with several consumers,
taken out of autograd's sum by the pass's hooks (_backward_pass.py), brought to one target scale T,
summed and rounded once — each step by the core, as gradscale's own join does it (lib/model/join.cpp):
`join` chooses T from the parts' maxima, `sum_scaled_parts` sums Σ g_i · float(T/S_i) from 0,
`round_join` rounds the sum at the join site. Scales are the core's handles: on a GPU, T is chosen and
the factors are read on the device, without a wait.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ._functions import differentiable, is_dense, owned_copy

Part = Tuple[int, torch.Tensor, int]  # (index of the node's output, gradient part, its scale's handle)


def join_parts(core, layer: int, parts: List[Part], grad_outputs) -> Tuple[list, int]:
    """`grad_outputs` with each output that received parts replaced by their join, and T. `core` is the
    Scaler's ExternalBackward (the maxima and the rounding where the tensors live); `layer` the layer
    whose boundary the node is (-1: none), the site of the rounding."""
    dense = [g if is_dense(g) else g.contiguous() for _, g, _ in parts]
    target = core.join([g.data_ptr() for g in dense], [g.numel() for g in dense], [s for _, _, s in parts])
    by_output: Dict[int, List[Tuple[torch.Tensor, int]]] = {}
    for j, g, s in parts:
        by_output.setdefault(j, []).append((g, s))
    grads = list(grad_outputs)
    for j, group in by_output.items():  # in the order the outputs' first parts arrived
        out = _core_sum(core, group, target)
        graph = _torch_sum(_factors(core, group, target)) if out is None or _building_graph(group) else None
        if out is None:
            out = owned_copy(graph)
        if out.numel():
            core.round_join(layer, out.data_ptr(), out.numel())
        grads[j] = out if graph is None else differentiable(graph, out, 1.0)
    return grads, target


def _core_sum(core, group: List[Tuple[torch.Tensor, int]], target: int) -> Optional[torch.Tensor]:
    """Σ g · float(T/S) by the core where the parts live (`core.sum_scaled_parts`: lib/model/join's loop
    on the host, lib/cuda's fill and scale_add — scale_add_rescaled for scales held there — on a GPU), in a
    new tensor, for float32 strided parts of one shape on one device; None for others (sparse parts:
    torch's sum)."""
    first = group[0][0]
    if not all(g.device == first.device and g.dtype == torch.float32 and g.layout == torch.strided and
               g.shape == first.shape for g, _ in group):
        return None
    # The sum in the memory layout torch's own sum of the parts would have: the layers after the join sum
    # in an order that follows the layout, so do their bits.
    out = torch.empty_strided(first.shape, _sum_strides(tuple(g.stride() for g, _ in group), first.shape),
                              dtype=torch.float32, device=first.device)
    values = [g.detach() if _same_layout(g, out) else torch.empty_like(out).copy_(g.detach()) for g, _ in group]
    if out.numel():
        core.sum_scaled_parts(out.data_ptr(), out.numel(), [v.data_ptr() for v in values],
                              [s for _, s in group], target)
    return out


_SUM_STRIDES: Dict[tuple, tuple] = {}  # (parts' strides, shape) -> the strides of torch's sum of them


def _sum_strides(strides: tuple, shape: torch.Size) -> tuple:
    """The strides torch gives the sum of float32 parts of `shape` with these strides: found once on the
    meta device, with no arithmetic, then remembered (each join of a network repeats its layouts every
    step, and the meta device's rules run in Python under torch 2: about half a millisecond a sum)."""
    key = (strides, tuple(shape))
    found = _SUM_STRIDES.get(key)
    if found is None:
        meta = _torch_sum([(torch.empty_strided(shape, s, dtype=torch.float32, device="meta"), 1.0)
                           for s in strides])
        found = tuple(meta.stride())
        if len(_SUM_STRIDES) >= 4096:  # a bound for programs whose shapes never repeat
            _SUM_STRIDES.clear()
        _SUM_STRIDES[key] = found
    return found


def _same_layout(g: torch.Tensor, dense: torch.Tensor) -> bool:
    """Whether g's element k in memory is dense's element k (same shape; strides of size-1 dims are free)."""
    return all(a == b for a, b, n in zip(g.stride(), dense.stride(), dense.shape) if n != 1)


def _factors(core, group: List[Tuple[torch.Tensor, int]], target: int) -> List[Tuple[torch.Tensor, float]]:
    """Each part with its factor T/S (the scales' values: on a GPU, read after a wait)."""
    t = core.scale_value(target)
    return [(g, t / core.scale_value(s)) for g, s in group]


def _torch_sum(terms: List[Tuple[torch.Tensor, float]]) -> torch.Tensor:
    """Σ g · factor in torch: the expression a create_graph differentiates (and the sum of sparse parts)."""
    total = None
    for g, factor in terms:
        term = g * factor  # fp32, the factor rounded to float as the C++ join does
        total = term if total is None else total + term
    return total


def _building_graph(group: List[Tuple[torch.Tensor, int]]) -> bool:
    """Whether the join's result must stay differentiable (backward with create_graph)."""
    return torch.is_grad_enabled() and any(g.requires_grad for g, _ in group)
