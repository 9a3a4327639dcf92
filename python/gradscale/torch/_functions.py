"""The autograd Functions the plug-in inserts where data crosses a layer boundary.

- `Enter` at a layer's input: forward rounds the input to the forward format; backward is SPEC §5
  step 2 — the layer's upstream gradient (computed by PyTorch in fp32 at the scale S_in the layer
  received) goes to the core, which chooses s and rounds s·g once. The gradient then carries s·S_in.
- `Exit` at a layer's output: forward rounds the output to the forward format; backward rounds the
  gradient the layer receives (it may come through fp32 functional ops) and notes S_in.
- `WorkingWeights` at a layer call's parameters (one node for all of them): forward is each working copy
  (the master rounded to the forward format, for this call only); backward is this call's
  weight-gradient part of each, rounded at its scale and divided by it (SPEC §4), so `.grad` only ever
  receives true gradients.
- `LossEdge` at the model's outputs: backward is SPEC §5 "Loss" — the fp32 loss gradient at scale 1
  times S0, rounded once (the core chooses S0 there, from that gradient when the policy looks at it).

Every numeric decision is the core's (`gradscale._core.ExternalBackward`); these only pass addresses,
through the backward pass that is running (`_backward_pass.BackwardPass`). Under `create_graph` each
result stays differentiable: a rounding is straight-through (the identity, as AMP's casts are) and a
scale a factor, so a gradient penalty's graph is exact in fp32 under power-of-two scales.
"""
from __future__ import annotations

import torch
from torch.utils.dlpack import from_dlpack

from .. import _core


def is_dense(t: torch.Tensor) -> bool:
    """Whether t's elements fill one block of memory (in any order of dimensions: contiguous,
    channels_last, a transpose): the core then reads its numel() values from data_ptr()."""
    if t.is_contiguous():
        return True
    dim = t.dim()
    if dim == 2:  # (a weight gradient through a transpose) sizes > 1 both, else t were contiguous
        return t.stride(0) == 1 and t.stride(1) == t.shape[0]
    if (dim == 4 and t.is_contiguous(memory_format=torch.channels_last)) or \
            (dim == 5 and t.is_contiguous(memory_format=torch.channels_last_3d)):
        return True
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz != 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def owned_copy(g: torch.Tensor) -> torch.Tensor:
    """A private, dense, detached fp32 copy of `g` for the core to write into (gradients handed to a
    backward may be shared with other edges: AddBackward passes one tensor to both inputs), in g's
    memory layout when g is dense (channels_last stays channels_last), else contiguous. Every
    operation of the core on it is elementwise or a statistic, so the order of its elements is free."""
    if g.dtype != torch.float32:
        raise TypeError(f"gradscale.torch: gradients must be float32, got {g.dtype} on {g.device}")
    g = g.detach()
    return g.clone() if is_dense(g) else g.clone(memory_format=torch.contiguous_format)


# The fewest float32 elements a tensor of the pool has: its blocks mapped outside malloc's heap. A smaller
# tensor comes from malloc's bins, which keep freed memory (no faults to save), for less than a DLPack
# tensor costs.
POOLED_ELEMENTS = _core.HostPool.mapped_bytes // 4


def new_like(x: torch.Tensor, pool=None) -> torch.Tensor:
    """An uninitialised float32 tensor with the sizes and strides of `x` (dense): on a block of `pool`
    (a `_core.HostPool`, on the CPU) when given and x has POOLED_ELEMENTS elements or more, whose memory,
    freed when torch lets go of the tensor, is taken again by the next step's tensors of the same size
    instead of being given back to the system and faulted in again (python/csrc/host_pool.h); else
    torch.empty_like."""
    if pool is None or x.numel() < POOLED_ELEMENTS or x.dtype is not torch.float32 or not x.is_cpu:
        return torch.empty_like(x)
    return from_dlpack(pool.tensor(x.shape, x.stride()))


def rounding_target(g: torch.Tensor, buffers=None, pool=None):
    """Where the core writes the rounding of a gradient `g` (it may be shared with other edges:
    AddBackward passes one tensor to both inputs, so it is never written): a tensor in g's layout —
    new (`new_like`, on `pool`'s memory when given), or from `buffers` (a `_tracker.Buffers`) — and g's
    address for the core to read from (one pass: the rounding writes the target), for a dense g; for
    another, a contiguous private copy rounded in place (address 0)."""
    if g.dtype != torch.float32:
        raise TypeError(f"gradscale.torch: gradients must be float32, got {g.dtype} on {g.device}")
    if g.requires_grad:  # a graph built by create_graph: the target is no part of it
        g = g.detach()
    if is_dense(g) and g.numel():
        if buffers is not None:
            return buffers.take(g), g.data_ptr()
        return new_like(g, pool), g.data_ptr()  # g dense: its strides kept
    return g.clone(memory_format=torch.contiguous_format), 0


def round_in_place(x: torch.Tensor, fmt: str, core) -> torch.Tensor:
    """x (dense) rounded to the forward format where it lies, by `core`; returns x."""
    n = x.numel()
    if fmt != "fp32" and n:
        core.quantize_(x.data_ptr(), n, fmt)
    return x


def round_forward(x: torch.Tensor, fmt: str, core, pool=None) -> torch.Tensor:
    """A new tensor: x rounded to the forward format (the identity copy for fp32), by `core` (an
    ExternalBackward) where x lives, in one pass over x, in x's memory layout when x is dense (then on
    `pool`'s memory when given: `new_like`)."""
    if x.requires_grad and torch.is_grad_enabled():  # (inside a Function's forward grad mode is off)
        x = x.detach()
    if not is_dense(x):
        return round_in_place(x.clone(memory_format=torch.contiguous_format), fmt, core)
    if not x.numel():
        return x.clone()
    out = new_like(x, pool)  # x dense (non-overlapping, no gaps): its strides kept
    if fmt == "fp32":
        return out.copy_(x)
    # x's sizes and strides: its numel() values in the same order from data_ptr() on both sides.
    core.quantize_into(x.data_ptr(), out.data_ptr(), x.numel(), fmt)
    return out


class _StraightThrough(torch.autograd.Function):
    """`value` (computed by the core from `g`) in forward; in backward the incoming gradient times
    `factor`: the rounding is the identity, the scale a factor."""

    @staticmethod
    def forward(ctx, g, holder, factor):  # type: ignore[override]
        ctx.factor = factor
        return holder[0]  # in a list: not an input of the Function, so autograd records a new output

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        return grad * ctx.factor, None, None


def differentiable(g: torch.Tensor, value: torch.Tensor, factor) -> torch.Tensor:
    """`value` as a result of `g` when a graph is being built (create_graph), else `value` itself.
    `factor`: a number, or a function giving it (a scale the core may hold on a device: read only when
    a graph needs it)."""
    if torch.is_grad_enabled() and g.requires_grad and not g.is_sparse:
        return _StraightThrough.apply(g, [value], factor() if callable(factor) else factor)
    return value


def _boundary_forward(ctx, x, tracker, call, rounded=False, in_place=False):
    ctx.tracker = tracker
    ctx.layer_id = call.layer_id
    ctx.call = call  # pairs a layer call's Exit with its Enter and holds its working weight
    if rounded:  # an earlier layer's output, already values of `format` (Tracker.is_rounded)
        return x.view_as(x)
    if in_place:  # a layer's new output that nothing else holds (_boundary.CallWrapper._own_output)
        ctx.mark_dirty(x)
        return round_in_place(x, tracker.format, tracker.core)
    return round_forward(x, tracker.format, tracker.core, tracker.pool)


def _recording(tracker):
    """The fp32 shadow pass that runs now (Scaler(shadow=True)), or None."""
    shadow = tracker.shadow
    return shadow if shadow is not None and shadow.recording else None


class Enter(torch.autograd.Function):
    forward = staticmethod(_boundary_forward)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        shadow = _recording(ctx.tracker)
        if shadow is not None:
            if g is not None:
                shadow.record_upstream(ctx.call, g)
            return g, None, None, None
        run = ctx.tracker.running()
        if g is None or run is None:
            return g, None, None, None
        return run.enter_backward(ctx, g), None, None, None


class Exit(torch.autograd.Function):
    forward = staticmethod(_boundary_forward)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        run = ctx.tracker.running()
        if g is None or run is None or _recording(ctx.tracker) is not None:
            return g, None, None, None, None
        return run.exit_backward(ctx, g), None, None, None, None


class WorkingWeights(torch.autograd.Function):
    """The working copies of a layer call's parameters that require grad: one node for all of them
    (a Linear's weight and bias are one node, not two). `apply(tracker, layer_id, *masters)` returns
    one copy per master; backward gets each copy's gradient (None for a copy the call did not use)."""

    @staticmethod
    def forward(ctx, tracker, layer_id, *masters):  # type: ignore[override]
        ctx.tracker = tracker
        ctx.layer_id = layer_id
        ctx.set_materialize_grads(False)  # an unused copy's gradient stays None: no part, no zeros
        # Each master's kept buffers on the CPU: its copy's, and its weight gradient's.
        ctx.buffers = [tracker.buffers(master) for master in masters]
        return tuple(tracker.working_copy(master, buffers) for master, buffers in zip(masters, ctx.buffers))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        shadow = _recording(ctx.tracker)
        if shadow is not None:
            for i, g in enumerate(grads):
                if g is not None:
                    shadow.record_weight((ctx, i), g)
            return (None, None) + grads
        run = ctx.tracker.running()
        if run is None:
            return (None, None) + grads
        parts = (g if g is None else run.weight_part(ctx, i, g) for i, g in enumerate(grads))
        return (None, None) + tuple(parts)


class LossEdge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, tracker):  # type: ignore[override]
        ctx.tracker = tracker
        return y.detach().clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        if g is None or _recording(ctx.tracker) is not None:
            return g, None  # the shadow pass: the loss gradient at scale 1
        return ctx.tracker.loss_backward(ctx, g), None
