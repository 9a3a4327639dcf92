"""What `Scaler(...)` is given, checked before anything is attached to the model: the options' types and
ranges, the formats and the policy as the core reads them, `overrides=` resolved to layer names, and the
core (with the device it works on) for the model's parameters. Each error names the argument.
"""
from __future__ import annotations

import fnmatch
import json
import math
from typing import Any, Dict, Union

import torch
from torch import nn

from .. import _core


def check_options(weight_grads: Any, record_every: Any, trace_every: Any, agree_scales: Any, trace_hist: Any,
                  shadow: Any) -> None:
    """The Scaler's options that are no format, policy or object, checked in the order of its signature."""
    if weight_grads not in ("format", "fp32"):
        raise ValueError(f"gradscale.torch: weight_grads must be 'format' or 'fp32', got {weight_grads!r}")
    for name, value, low in (("record_every", record_every, 0), ("trace_every", trace_every, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"gradscale.torch: {name} must be an integer >= {low}, got {value!r}")
    for name, value in (("agree_scales", agree_scales), ("trace_hist", trace_hist), ("shadow", shadow)):
        if not isinstance(value, bool):
            raise ValueError(f"gradscale.torch: {name} must be True or False, got {value!r}")


def json_text(value: Any, call: str) -> str:
    """`value` as JSON for the core: NaN, inf and objects JSON has no form for are refused here, naming the
    call (the core's parser would only say 'invalid literal' at a column)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError as e:
        raise ValueError(f"gradscale.torch: {call}: numbers must be finite, got {value!r}") from e
    except TypeError as e:
        raise TypeError(f"gradscale.torch: {call}: {e} (give numbers, strings, lists and dicts)") from e


def policy_json(scaler: Union[str, Dict[str, Any]]) -> str:
    if isinstance(scaler, (dict, str)):
        return json_text(scaler, "Scaler(scaler=...)")  # a str is CLI text: "torch", "static:1024", or a JSON object
    raise TypeError(f"gradscale.torch: Scaler(scaler=...) takes a policy name or a configuration dict, "
                    f"got {type(scaler).__name__} {scaler!r}")


def check_format(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"gradscale.torch: Scaler({name}=...) takes a format name (fp32, fp16, bf16, fp8_e5m2, "
                        f"fp8_e4m3), got {type(value).__name__} {value!r}")
    return _core.check_format(value)


def refuse_element_wise(config: Any) -> None:
    """method 'element_wise' (for the whole model or a layer) needs what a PyTorch model does not expose."""
    element_wise = ["scaler="] if isinstance(config, dict) and config.get("method") == "element_wise" else []
    element_wise += [f"overrides for layer '{name}'" for name, o in (config.get("layers") or {}).items()
                     if isinstance(o, dict) and o.get("method") == "element_wise"] if isinstance(config, dict) else []
    if element_wise:
        raise ValueError(f"gradscale.torch: method 'element_wise' ({element_wise[0]}) needs the partial products "
                         "of gradscale's own Linear/Conv2d layers, which a PyTorch model does not expose; use "
                         "'measured' or 'approx_range' (or gradscale's own engine: gradscale train)")


def resolve_overrides(overrides: Any, layers, config: dict) -> Dict[str, Any]:
    """`overrides=` as the adaptive policy's "layers" object: {layer name: "global" or its keys}."""
    if not isinstance(overrides, dict):
        raise TypeError(f"gradscale.torch: Scaler(overrides=...) takes a dict {{layer name, pattern or module type: "
                        f"settings}}, got {type(overrides).__name__}")
    if not isinstance(config, dict) or config.get("policy") != "adaptive" or "controller" in config:
        raise ValueError("gradscale.torch: Scaler(overrides=...) needs the adaptive policy with a built-in method "
                         f"(scaler={{'policy': 'adaptive', ...}}), got policy {config.get('policy')!r}")
    resolved: Dict[str, Any] = {}
    for key, value in overrides.items():
        if isinstance(key, type) and issubclass(key, nn.Module):
            chosen = [l for l in layers if isinstance(l.module, key)]
            what = f"module type {key.__name__}"
        elif isinstance(key, str):
            chosen = [l for l in layers if fnmatch.fnmatchcase(l.name, key)]
            what = f"'{key}'"
        else:
            raise TypeError(f"gradscale.torch: overrides= keys are layer names, name patterns or module types, "
                            f"got {key!r}")
        if not chosen:
            names = ", ".join(l.name for l in layers)
            raise ValueError(f"gradscale.torch: overrides= names {what}, which matches no layer (layers: {names})")
        if isinstance(value, bool) or not isinstance(value, (str, int, float, dict)):
            raise TypeError(f"gradscale.torch: overrides[{key!r}] must be \"global\", a number (a fixed local "
                            f"scale) or a dict of per-layer keys, got {value!r}")
        if isinstance(value, (int, float)):
            if not (isinstance(value, int) or math.isfinite(value)) or abs(value) > 3.4e38:
                raise ValueError(f"gradscale.torch: overrides[{key!r}] = {value!r}: a fixed local scale must be a "
                                 "finite float32 number > 0")
            value = {"method": "fixed", "fixed_scale": float(value)}
        elif isinstance(value, dict):
            json_text(value, f"Scaler(overrides={{{key!r}: ...}})")
        for layer in chosen:
            if isinstance(value, str) or isinstance(resolved.get(layer.name), str):
                resolved[layer.name] = value
            else:
                resolved[layer.name] = {**resolved.get(layer.name, {}), **value}
    return resolved


def model_device(model: nn.Module) -> torch.device:
    """The one device of the model's parameters (ValueError when they are spread over several)."""
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        raise ValueError("gradscale.torch: the model's parameters are on several devices "
                         f"({', '.join(sorted(str(d) for d in devices))}); a Scaler works on one")
    return devices.pop() if devices else torch.device("cpu")  # no parameters: build_layers refused it


def core_for(device: torch.device, cpu_target: bool):
    """The core module and the device its ExternalBackward works on, for a model on `device`."""
    if cpu_target:
        if device.type != "cpu":
            raise ValueError("gradscale.torch: the CPU execution target takes CPU tensors")
        try:
            from .. import _core_cpu_target
        except ImportError as e:
            raise RuntimeError("gradscale.torch: the core over lib/cuda's CPU execution target was not built "
                               "(a build with CUDA and the tests: scripts/build.sh)") from e
        return _core_cpu_target, "cuda"
    if device.type == "cpu":
        return _core, "cpu"
    if device.type == "cuda":
        if not _core.cuda_built():
            raise ValueError(f"gradscale.torch: the model is on {device}, but this gradscale core was built "
                             "without CUDA (rebuild with the CUDA toolkit: scripts/build.sh with nvcc on PATH)")
        return _core, f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    raise ValueError(f"gradscale.torch: the model is on {device}; the core works on the CPU and on CUDA GPUs")
