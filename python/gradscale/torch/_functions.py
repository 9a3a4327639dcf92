"""The three autograd Functions the plug-in inserts where data crosses a layer boundary.

- `Enter` at a layer's input: forward rounds the input to the forward format; backward is SPEC §5
  step 2 — the layer's upstream gradient (computed by PyTorch in fp32 at the scale S_in the layer
  received) goes to the core, which chooses s and rounds s·g once. The gradient then carries s·S_in.
- `Exit` at a layer's output: forward rounds the output to the forward format; backward rounds the
  gradient the layer receives (it may come through fp32 functional ops) and notes S_in.
- `LossEdge` at the model's outputs: backward is SPEC §5 "Loss" — the fp32 loss gradient at scale 1
  times S0, rounded once (the core chooses S0 there, from that gradient when the policy looks at it).

Every numeric decision is the core's (`gradscale._core.ExternalBackward`); these only pass addresses.
"""
from __future__ import annotations

import torch


def _owned_copy(g: torch.Tensor) -> torch.Tensor:
    # Gradients handed to a backward may be shared with other edges (AddBackward passes one tensor to
    # both inputs): round a private, contiguous fp32 copy.
    if g.dtype != torch.float32:
        raise TypeError(f"gradscale.torch: gradients must be float32, got {g.dtype} on {g.device}")
    return g.detach().to(memory_format=torch.contiguous_format).clone()


def round_forward(x: torch.Tensor, fmt: str, core) -> torch.Tensor:
    """A new tensor: x rounded to the forward format (the identity copy for fp32), by `core` (an
    ExternalBackward) where x lives."""
    out = x.detach().contiguous().clone()
    if fmt != "fp32":
        core.quantize_(out.data_ptr(), out.numel(), fmt)
    return out


def _boundary_forward(ctx, x, session, layer_id, call):
    ctx.session = session
    ctx.layer_id = layer_id
    ctx.call = call  # pairs a layer call's Exit with its Enter (a module may be called twice)
    return round_forward(x, session.format, session.core)


def _boundary_backward(ctx, g, handler):
    if g is None or not ctx.session.active:
        return g, None, None, None
    out = _owned_copy(g)
    handler(ctx, out)  # rounds `out` in place
    return out, None, None, None


class Enter(torch.autograd.Function):
    forward = staticmethod(_boundary_forward)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return _boundary_backward(ctx, g, ctx.session.enter_backward)


class Exit(torch.autograd.Function):
    forward = staticmethod(_boundary_forward)

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        return _boundary_backward(ctx, g, ctx.session.exit_backward)


class LossEdge(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, session):  # type: ignore[override]
        ctx.session = session
        return y.detach().clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        session = ctx.session
        if g is None:
            return None, None
        if not session.active:
            raise RuntimeError("gradscale.torch: backward through a model with a gradscale Scaler must start "
                               "from scaler.scale(loss) (call scaler.scale(loss).backward())")
        out = _owned_copy(g)
        session.loss_backward(ctx, out)
        return out, None
