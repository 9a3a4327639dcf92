"""The layer table of a PyTorch model as gradscale's core sees it (SPEC §5–§6).

A layer is a module whose parameters gradscale rounds and unscales; the GEMM layers among them
(Linear, Conv1d/2d/3d) are *parametric*: their controller chooses a local scale s from the statistics
of the gradient they send upstream. By default the layers are the leaf modules with parameters, plus
any module that owns parameters directly (its functional use of them is still rounded and unscaled).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Union

import torch
from torch import nn


@dataclass
class Layer:
    id: int
    name: str
    module: nn.Module
    kind: str
    parametric: bool
    reduction: int
    weight: Optional[nn.Parameter]
    params: List[nn.Parameter] = field(default_factory=list)
    # Its calls are boundaries (inputs and outputs rounded, the local scale applied): a leaf module, or
    # one chosen by name. A container that only owns parameters of its own is not one.
    boundary: bool = True
    # Whether the layer's parameters include its descendants' (a module chosen with layers=).
    recurse: bool = False
    # The parameter the controller reads as the layer's weight ("in_proj_weight" for attention).
    weight_name: str = "weight"
    # nn.MultiheadAttention, emulated by the plug-in (_boundary.CallWrapper): its out_proj runs as a
    # module call, so it is a layer of its own.
    attention: bool = False
    # Its parameters were seen used without a call of its module (the Scaler warned once).
    unemulated: bool = False

    @property
    def emulation(self) -> str:
        """What the plug-in does at this layer (docs/pytorch.md, "The emulation boundary"): "gemm"
        (inputs and outputs rounded, the working weight, a local scale), "attention" (the same at its
        query/key/value and in-projection; softmax and the attention products in fp32; out_proj a layer
        of its own), "recurrent" (inputs, outputs and working weights rounded, s = 1; the gate
        products inside in fp32), "boundary" (inputs, outputs and working weights rounded, s = 1),
        "parameters" (a container: its own parameters' working copies where its forward uses them),
        "not emulated" (its parameters are used without calling it: fp32 uses, s = 1)."""
        if self.unemulated:
            return "not emulated"
        if self.attention:
            return "attention"
        if not self.boundary:
            return "parameters"
        if self.parametric:
            return "gemm"
        return "recurrent" if isinstance(self.module, nn.RNNBase) else "boundary"

    def current_params(self) -> List[nn.Parameter]:
        """The parameters the layer holds now, read from its modules (a Parameter object may be replaced
        after the table was made: load_state_dict(assign=True), functional_call). Read every backward
        pass: a layer of its module's own parameters reads them without nn.Module's generators."""
        if self.recurse:
            return [p for p in self.module.parameters() if p.requires_grad]
        found: List[nn.Parameter] = []
        for p in self.module._parameters.values():  # each once, in order, as parameters(recurse=False)
            if p is not None and p.requires_grad and not any(p is q for q in found):
                found.append(p)
        return found

    def row(self) -> dict:
        return {
            "name": self.name,
            "kind": self.kind,
            "parametric": self.parametric,
            "reduction": self.reduction,
            "weight_shape": list(self.weight.shape) if self.parametric and self.weight is not None else [],
        }


def _gemm_reduction(module: nn.Module) -> Optional[int]:
    """K of SPEC §6.1: the reduction length of the upstream GEMM g·Wᵀ, or None for other layers."""
    if isinstance(module, nn.Linear):
        return module.out_features
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        # Each input channel's gradient sums over its group's output channels and the kernel window.
        return module.out_channels // module.groups * math.prod(module.kernel_size)
    return None


def _owns_params(module: nn.Module) -> bool:
    return any(True for _ in module.parameters(recurse=False))


def build_layers(model: nn.Module, layers: Optional[Sequence[Union[str, nn.Module]]]) -> List[Layer]:
    """The layer table: `layers` (names or modules of `model`) or, by default, every module that owns
    parameters directly. ValueError for a model without parameters or a name naming no module."""
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(f"gradscale.torch: model {type(model).__name__} has no trainable parameters")
    other = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float32})
    if other:
        raise ValueError(f"gradscale.torch: the model's parameters must be float32 (the masters; format= chooses "
                         f"the stored values), got {', '.join(other)}")
    names: Dict[int, str] = {id(m): (n or "model") for n, m in model.named_modules()}
    if layers is None:
        chosen = [m for _, m in model.named_modules() if _owns_params(m)]
    else:
        if isinstance(layers, (str, nn.Module)):  # a string would be read letter by letter
            hint = f"layers=[{layers!r}]" if isinstance(layers, str) else "layers=[module]"
            raise TypeError(f"gradscale.torch: layers= takes a list of module names or modules, got one "
                            f"{type(layers).__name__}: write {hint}")
        by_name = dict(model.named_modules())
        chosen = []
        for entry in layers:
            if isinstance(entry, nn.Module):
                if id(entry) not in names:
                    raise ValueError(f"gradscale.torch: layers= names a {type(entry).__name__} that is not a "
                                     f"module of the model")
                chosen.append(entry)
            elif isinstance(entry, str):
                if entry not in by_name:
                    close = [n for n in by_name if n and entry in n][:5]
                    raise ValueError(f"gradscale.torch: layers= names '{entry}', which is no module of the "
                                     f"model" + (f" (did you mean {close}?)" if close else ""))
                chosen.append(by_name[entry])
            else:
                raise ValueError(f"gradscale.torch: layers= takes module names or modules, got {entry!r}")
        if not chosen:
            raise ValueError("gradscale.torch: layers= names no module")
    table: List[Layer] = []
    seen_params: set = set()
    for module in chosen:
        if any(m is module for m in (l.module for l in table)):
            continue
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        # A chosen module that is not a leaf (layers=[block]) owns its descendants' parameters that no
        # other chosen module owns.
        if layers is not None:
            own = [p for p in module.parameters() if p.requires_grad]
        own = [p for p in own if id(p) not in seen_params]
        seen_params.update(id(p) for p in own)
        k = _gemm_reduction(module)
        weight_name = "weight"
        attention = isinstance(module, nn.MultiheadAttention)
        if attention:
            # Each of query, key and value's gradients is a product with its E×E block of the
            # in-projection, a sum over E outputs.
            k = module.embed_dim
            weight_name = "in_proj_weight" if module.in_proj_weight is not None else "q_proj_weight"
            if layers is not None:  # chosen by name: out_proj is not a layer then, but still its own call
                own = [p for p in own if not any(p is q for q in module.out_proj.parameters())]
        weight = getattr(module, weight_name, None) if k is not None else None
        table.append(Layer(id=len(table), name=names[id(module)], module=module, kind=type(module).__name__.lower(),
                           parametric=k is not None and isinstance(weight, torch.Tensor),
                           reduction=int(k or 0), weight=weight, params=own,
                           boundary=attention or layers is not None or not any(True for _ in module.children()),
                           recurse=layers is not None and not attention, weight_name=weight_name,
                           attention=attention))
    return table


def trace_table(table: Iterable[Layer], model: nn.Module) -> List[dict]:
    """The layer table of a trace (docs/trace.md), written when the Scaler is made: the layers' inputs are
    left empty, since the plug-in learns them from autograd only during backward passes
    (_backward_pass.py's layer graph, given to the core as LayerInfo::inputs)."""
    names = {id(p): n for n, p in model.named_parameters()}
    rows = []
    for layer in table:
        params = list(layer.params)
        if layer.parametric and not any(p is layer.weight for p in params):
            params.insert(0, layer.weight)  # a tied weight another layer owns: this layer trains it too
        rows.append({"id": layer.id, "name": layer.name, "kind": layer.kind, "inputs": [], "K": layer.reduction,
                     "parametric": layer.parametric,
                     "parameters": [{"name": names.get(id(p), "?"), "shape": list(p.shape)} for p in params]})
    return rows


def warn_unemulated(table: Iterable[Layer], rows: List[dict], reached: set) -> None:
    """Names, once, a layer whose parameters a backward pass reached although the layer never ran in its
    step (`rows`: the core's layer_scales(); `reached`: the ids of the layers whose parameters are leaves
    of the pass's graph): its module's parameters were used without calling it (functionally, by another
    module), so those uses are not rounded there and take no local scale. (Not `.grad`: a layer skipped
    in a step, as stochastic depth skips one, keeps the `.grad` of its earlier steps.)"""
    for row, layer in zip(rows, table):
        if not layer.boundary or row["ran"] or layer.unemulated:
            continue
        if layer.id in reached:
            layer.unemulated = True
            warnings.warn(f"gradscale.torch: the parameters of layer '{layer.name}' "
                          f"({type(layer.module).__name__}) are used without calling it: those uses compute in "
                          "fp32 at the scale they meet, with exact gradients but no rounding to format= and no "
                          "local scale (layer_scales() says 'not emulated')", stacklevel=2)
