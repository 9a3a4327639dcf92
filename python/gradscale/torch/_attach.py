"""Where a Scaler hooks into a model, and how `remove()` takes it all back: each layer's `CallWrapper`
as its forward with its pre-hook and hook (_boundary.py), the model's own pre-hook and hook (bound
methods of the Scaler: the stream, and `LossEdge` at the outputs), and torch's fused encoder paths off
while attached. One Scaler per model.
"""
from __future__ import annotations

from typing import List, Tuple

from torch import nn

from ._boundary import CallWrapper, attached


def refuse_attached(model: nn.Module) -> None:
    """Refuses a model that has a Scaler; detaches the copy of a Scaler that copy.deepcopy(model) made."""
    for module in model.modules():
        other = attached(module)
        if other is None:
            continue
        if getattr(other, "_copied", False):
            other.remove()  # the copy copy.deepcopy(model) made: a new Scaler takes its place
            continue
        raise ValueError(f"gradscale.torch: {type(model).__name__} already has a gradscale Scaler attached "
                         "(one Scaler per model: call the first one's remove() to detach it)")


def attach(scaler, model: nn.Module, layers) -> Tuple[List[CallWrapper], List[Tuple[nn.Module, bool]]]:
    """Installs the scaler's wrappers and hooks; returns the wrappers and the fused paths turned off
    (each module with its flag), for detach()."""
    wrappers: List[CallWrapper] = []
    for layer in layers:
        wrapper = CallWrapper.install(scaler, layer)
        wrappers.append(wrapper)
        if layer.boundary:
            layer.module.register_forward_pre_hook(wrapper.pre_hook)
            layer.module.register_forward_hook(wrapper.hook)
    model.register_forward_pre_hook(scaler._model_pre_hook)
    model.register_forward_hook(scaler._model_hook)
    # torch's fused inference paths compute a whole encoder layer from its parameters without calling
    # its layers: off while the Scaler is attached (their flag back at remove()).
    fast_paths = [(m, m.activation_relu_or_gelu) for m in model.modules()
                  if isinstance(m, nn.TransformerEncoderLayer) and getattr(m, "activation_relu_or_gelu", False)]
    for module, _ in fast_paths:
        module.activation_relu_or_gelu = False
    return wrappers, fast_paths


def detach(scaler, model: nn.Module, wrappers: List[CallWrapper], fast_paths: List[Tuple[nn.Module, bool]]) -> None:
    """Undoes attach(): the scaler's hooks and wrappers off the model, the fused paths' flags back."""
    for module in model.modules():
        for hooks in (module._forward_pre_hooks, module._forward_hooks):
            for key, hook in list(hooks.items()):
                owner = getattr(hook, "__self__", None)
                if owner is scaler or (isinstance(owner, CallWrapper) and owner.scaler is scaler):
                    del hooks[key]
    for wrapper in wrappers:
        wrapper.remove()
    for module, flag in fast_paths:
        module.activation_relu_or_gelu = flag
