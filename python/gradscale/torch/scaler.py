"""`gradscale.torch.Scaler`: per-layer adaptive loss scaling for an existing `nn.Module`, with the
names and call order of `torch.amp.GradScaler` (scale, unscale_, step, update, state_dict).

    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"},
                    format="fp16", grad_format="fp8_e5m2")
    loss = loss_fn(model(x), y)
    scaler.scale(loss).backward()
    applied = scaler.step(optimizer)       # False: the step was skipped (an overflow)
    scaler.update()

What differs from GradScaler, because scales are per layer: `.grad` holds the *true* gradient as soon
as backward returns (each weight-gradient part is divided by the scale it was computed at, SPEC §4),
so `unscale_` has nothing left to divide and only marks the optimizer (clip after it as usual);
`scale(loss)` returns the loss itself — S0 multiplies the fp32 loss gradient where it enters the
model, before its one rounding (SPEC §5), so the loss's own graph runs unscaled in fp32.

The model's parameters are its fp32 masters at every moment the caller can see them: a layer's working
copy in `format` exists only inside that layer's own forward (`_boundary`). The Scaler's state is per
backward pass (`_backward_pass`): several passes per step, a pass that raised, several optimizers.

Every decision (S0, each layer's s, joins, rounding, found_inf, skip) is made by gradscale's C++ core
(`gradscale._core`); this package only finds where on the autograd graph to ask for it. Tensors in
float32 on the CPU, or on a GPU when the core was built with CUDA: there the core's rounding, statistics
and maxima are lib/cuda's kernels, on PyTorch's current stream.
"""
from __future__ import annotations

import copy
import fnmatch
import json
import math
import os
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from .. import _core
from . import _distributed
from ._backward_pass import BackwardPass, _install_backward_wrapper
from ._boundary import CallWrapper, attached, map_tensors
from ._functions import LossEdge
from ._layers import build_layers, trace_table
from ._shadow import Shadow
from ._tracker import Tracker


def _json_text(value: Any, call: str) -> str:
    """`value` as JSON for the core: NaN, inf and objects JSON has no form for are refused here, naming the
    call (the core's parser would only say 'invalid literal' at a column)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError as e:
        raise ValueError(f"gradscale.torch: {call}: numbers must be finite, got {value!r}") from e
    except TypeError as e:
        raise TypeError(f"gradscale.torch: {call}: {e} (give numbers, strings, lists and dicts)") from e


def _policy_json(scaler: Union[str, Dict[str, Any]]) -> str:
    if isinstance(scaler, (dict, str)):
        return _json_text(scaler, "Scaler(scaler=...)")  # a str is CLI text: "torch", "static:1024", or a JSON object
    raise TypeError(f"gradscale.torch: Scaler(scaler=...) takes a policy name or a configuration dict, "
                    f"got {type(scaler).__name__} {scaler!r}")


def _format(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"gradscale.torch: Scaler({name}=...) takes a format name (fp32, fp16, bf16, fp8_e5m2, "
                        f"fp8_e4m3), got {type(value).__name__} {value!r}")
    return _core.check_format(value)


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _check_trace_path(trace: Any) -> str:
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


def _nonfinite(grad: torch.Tensor) -> bool:
    values = grad.coalesce().values() if grad.is_sparse else grad
    return not bool(torch.isfinite(values).all())


class Scaler:
    """Per-layer loss scaling for `model` (see the module docstring).

    Args:
        model: the network; its modules with parameters become layers (or `layers=`). One Scaler per
            model: a second is refused until `remove()` detaches the first.
        scaler: any policy the CLI takes — "torch", "static:1024", {"policy": "adaptive", "method":
            "measured"}, or a policy registered in C++ — as a name, CLI text or dict.
        format: forward values and working weights (fp32, fp16, bf16, fp8_e5m2, fp8_e4m3).
        grad_format: activation and weight gradients (default: `format`).
        layers: module names or modules to treat as layers (default: every module owning parameters).
        weight_grads: "format" (rounded to grad_format, SPEC §4) or "fp32" (kept in fp32).
        record_every: take the full SPEC §3 statistics every N steps (underflow rates in
            `layer_scales()`); 0 never.
        process_group: under torch.distributed, the group whose ranks take the same S0 and per-layer
            scales (statistics reduced inside backward) and one verdict per step (default: the world,
            when initialized; False: never reduce).
        agree_scales: with a process group, reduce the statistics the scales are chosen from (True,
            the default: a few collectives per layer inside backward); False: each rank chooses S0
            and its layers' scales from its own rows (the verdict is still the group's).
        overrides: per-layer settings of the adaptive policy, {key: value}. A key is a layer's name, a
            pattern of names (fnmatch: "blocks.*.fc1") or a module type (nn.Embedding); a value is
            "global" (the layer sends its gradient at s = 1: the global scale), a number (a fixed local
            scale) or a dict of the policy's per-layer keys (method, n_uf, scale_upper_bound,
            accum_upper_bound, power_of_two, update_every, relu_factor, fixed_scale, margin). Entries
            apply in order; a later one's keys win. Shown in `layer_scales()` and the trace header.
        shadow: on steps with statistics (`record_every`, `trace_every`), differentiate the step's first
            loss once more in fp32 with nothing rounded or scaled, and give per layer in
            `layer_scales()` what precision cost its gradients (underflowed mass, relative error,
            cosine): one more backward pass on those steps.
        trace: write the per-layer trace of SPEC §8 to `trace`.jsonl while training (and `trace`.json
            at `close()`), in the `gradscale.trace/1` schema `gradscale inspect` and
            scripts/plot_trace.py read; `trace_every` steps with full statistics (plus every skipped,
            overflowing or rescaled step); `trace_hist` adds binade histograms.
        The model's parameters must all be float32 on one device, the CPU or a GPU (the core then
        works there).
    """

    def __init__(self, model: nn.Module, scaler: Union[str, Dict[str, Any]] = "torch", *, format: str = "fp16",
                 grad_format: Optional[str] = None, layers: Optional[Sequence[Union[str, nn.Module]]] = None,
                 weight_grads: str = "format", record_every: int = 10, process_group: Any = None,
                 trace: Optional[str] = None, trace_every: int = 10, trace_hist: bool = False,
                 agree_scales: bool = True, overrides: Optional[Dict[Any, Any]] = None, shadow: bool = False,
                 _cpu_target: bool = False):
        if not isinstance(model, nn.Module):
            raise TypeError(f"gradscale.torch: Scaler needs an nn.Module, got {type(model).__name__}")
        for module in model.modules():
            other = attached(module)
            if other is None:
                continue
            if getattr(other, "_copied", False):
                other.remove()  # the copy copy.deepcopy(model) made: a new Scaler takes its place
                continue
            raise ValueError(f"gradscale.torch: {type(model).__name__} already has a gradscale Scaler attached "
                             "(one Scaler per model: call the first one's remove() to detach it)")
        if weight_grads not in ("format", "fp32"):
            raise ValueError(f"gradscale.torch: weight_grads must be 'format' or 'fp32', got {weight_grads!r}")
        for name, value, low in (("record_every", record_every, 0), ("trace_every", trace_every, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"gradscale.torch: {name} must be an integer >= {low}, got {value!r}")
        for name, value in (("agree_scales", agree_scales), ("trace_hist", trace_hist), ("shadow", shadow)):
            if not isinstance(value, bool):
                raise ValueError(f"gradscale.torch: {name} must be True or False, got {value!r}")
        self.format = _format("format", format)
        self.grad_format = _format("grad_format", grad_format) if grad_format is not None else self.format
        self.record_every = record_every
        self._shadow = shadow
        self._process_group = process_group
        self._agree_scales = agree_scales
        self._model = model
        self._layers = build_layers(model, layers)
        self._device = _model_device(model)
        # _cpu_target (the tests'): the core over lib/cuda's CPU execution target, whose "device memory"
        # is the host's, so the CUDA path runs on CPU tensors (tests/cuda_on_cpu, docs/pytorch.md).
        self._core_module, core_device = _core_for(self._device, _cpu_target)
        self._core_args = ([l.row() for l in self._layers], self.format, self.grad_format, weight_grads == "format",
                           _policy_json(scaler), core_device)
        self._attach_core()
        config = json.loads(self._core.scaler_config())
        self._overrides: Dict[str, Any] = {}
        if overrides is not None:
            self._overrides = resolve_overrides(overrides, self._layers, config)
            config["layers"] = self._overrides
            self._core_args = self._core_args[:4] + (json.dumps(config),) + self._core_args[5:]
            try:
                self._attach_core()
            except ValueError as e:  # the core's ConfigError, naming the layer and key
                raise ValueError(f"gradscale.torch: Scaler(overrides=...): {e}") from e
            config = json.loads(self._core.scaler_config())
        element_wise = ["scaler="] if isinstance(config, dict) and config.get("method") == "element_wise" else []
        element_wise += [f"overrides for layer '{name}'" for name, o in (config.get("layers") or {}).items()
                         if isinstance(o, dict) and o.get("method") == "element_wise"] if isinstance(config, dict) else []
        if element_wise:
            raise ValueError(f"gradscale.torch: method 'element_wise' ({element_wise[0]}) needs the partial products "
                             "of gradscale's own Linear/Conv2d layers, which a PyTorch model does not expose; use "
                             "'measured' or 'approx_range' (or gradscale's own engine: gradscale train)")
        self._trace = None
        if trace is not None:
            base = _check_trace_path(trace)
            header = {"version": _core.__version__,
                      "config": {"model": type(model).__name__, "writer": "gradscale.torch",
                                 "torch": torch.__version__},
                      "format": self.format, "grad_format": self.grad_format,
                      "scaler": config, "seed": int(torch.initial_seed()),
                      "layers": trace_table(self._layers, model)}
            self._trace = self._core_module.TraceWriter(base, json.dumps(header), trace_every, trace_hist)
            self._trace_counts = {"skipped": 0, "overflows": 0}  # every such step is traced
        self._shadow_rows: Dict[int, Optional[dict]] = {}
        self._started = time.time()
        self.skipped_steps = 0  # steps skipped since the scaler was made (or its state loaded)
        self._scaler_seconds = 0.0
        self._last: Optional[dict] = None
        self._unchecked_passes = 3  # the first passes are checked for layers used without being called
        self._reset_step()
        _install_backward_wrapper()
        self._wrappers: List[CallWrapper] = []
        for layer in self._layers:
            wrapper = CallWrapper.install(self, layer)
            self._wrappers.append(wrapper)
            if layer.boundary:
                layer.module.register_forward_pre_hook(wrapper.pre_hook)
                layer.module.register_forward_hook(wrapper.hook)
        model.register_forward_pre_hook(self._model_pre_hook)
        model.register_forward_hook(self._model_hook)
        # torch's fused inference paths compute a whole encoder layer from its parameters without calling
        # its layers: off while the Scaler is attached (their flag back at remove()).
        self._fast_paths = [(m, m.activation_relu_or_gelu) for m in model.modules()
                            if isinstance(m, nn.TransformerEncoderLayer) and getattr(m, "activation_relu_or_gelu", False)]
        for module, _ in self._fast_paths:
            module.activation_relu_or_gelu = False

    # ---- the GradScaler API --------------------------------------------------------------------
    def scale(self, outputs: torch.Tensor) -> torch.Tensor:
        """Opens the step (or adds a backward pass to it) and prepares the autograd graph of `outputs`
        (the scalar loss) for per-layer scaling. Returns `outputs` unchanged: S0 is applied to the loss
        gradient where it enters the model. Reads the loss's value (a host wait on a GPU)."""
        if not isinstance(outputs, torch.Tensor):
            raise TypeError(f"gradscale.torch: scale() takes the loss tensor, got {type(outputs).__name__}")
        if outputs.numel() != 1:
            raise ValueError(f"gradscale.torch: scale() takes a scalar loss, got a tensor of shape "
                             f"{tuple(outputs.shape)} (reduce it with .mean() or .sum())")
        if outputs.grad_fn is None:
            raise ValueError("gradscale.torch: the loss has no autograd graph (computed under no_grad, or "
                             "from nothing that requires grad)")
        self._check_stale()
        if self._verdict is not None:
            raise RuntimeError("gradscale.torch: scale() after step() — call update() first")
        run = self._tracker.new_pass(outputs.grad_fn)
        if run.model_nodes == 0:
            run.close("abandoned")
            raise ValueError("gradscale.torch: the loss does not depend on the model's outputs "
                             f"({type(self._model).__name__} returned nothing this loss reads)")
        if not hasattr(run, "loss_value"):
            run.loss_value = float(outputs.detach())
            group = _distributed.group_of(self._process_group) if self._agree_scales else None
            if group is not None:
                try:
                    _distributed.check_same_graph(run.signature, group)
                except RuntimeError:
                    run.close("abandoned")
                    raise
        if not self._step_open:
            self._attach_reducer()
            # The layer graph the walk found, for SPEC §6.5's charging (given between steps: a graph
            # that grows in a later pass is given at the next step).
            graph = self._tracker.take_layer_graph()
            if graph is not None:
                self._core.set_layer_inputs(graph)
            record = self.record_every > 0 and self._core.steps % self.record_every == 0
            if self._trace is not None:
                record = self._trace.samples(self._core.steps + 1)
            self._core.begin_step(record)
            self._step_open = True
            self._tracker.shadow = None
            if self._shadow and record:
                self._run_shadow(outputs)
        return outputs

    def _run_shadow(self, loss: torch.Tensor) -> None:
        """The step's fp32 shadow (_shadow.py): the same graph differentiated with nothing rounded or
        scaled, before the step's first low-precision pass compares with it."""
        shadow = Shadow()
        self._tracker.shadow = shadow
        shadow.recording = True
        try:
            params = [p for p in self._model.parameters() if p.requires_grad]
            torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
        finally:
            shadow.recording = False

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Marks `optimizer` as unscaled. Its parameters' `.grad` already hold true gradients (each
        layer's part was divided by its own scale during backward), so clipping may follow now."""
        self._check_stale()
        self._expect_backwarded("unscale_")
        if id(optimizer) in self._stepped:
            raise RuntimeError("unscale_() is being called after step().")
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs) -> bool:
        """The step's verdict (taken at the first step() of the step: found_inf → skip, with the
        policy's back-off), then `optimizer.step(*args, **kwargs)` unless this optimizer is skipped.
        With several optimizers each is skipped on its own, as GradScaler does (docs/pytorch.md).
        Returns True when applied."""
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if gradscale.torch.Scaler is enabled.")
        self._check_stale()
        self._expect_backwarded("step")
        if id(optimizer) in self._stepped:
            raise RuntimeError("step() has already been called since the last update().")
        self._take_verdict()
        applied = self._applies_to(optimizer)
        if applied:
            optimizer.step(*args, **kwargs)
        self._stepped[id(optimizer)] = applied
        return applied

    def update(self, new_scale: Optional[float] = None) -> None:
        """Closes the step; get_scale() then gives the next step's scale. (The policy took step()'s
        verdict already; without a step() the verdict is taken here, the optimizers untouched.)"""
        if new_scale is not None:
            raise ValueError("gradscale.torch: update(new_scale) is not supported: S0 and every layer's scale "
                             "belong to the policy (configure it with scaler=, e.g. 'static:1024')")
        self._check_stale()
        if not self._step_open:
            return
        if self._passes_done == 0 and self._failure is None:
            raise RuntimeError("gradscale.torch: update() after scale() but before backward()")
        self._take_verdict()
        self._reset_step()

    def get_scale(self) -> float:
        """S0, the scale at the loss, as GradScaler's: the scale of the step in progress until update(),
        then the next step's."""
        if self._verdict is not None:
            scale = self._verdict["loss_scale"]
            if not math.isnan(scale):
                return float(scale)
        elif self._step_open and not math.isnan(self._core.loss_scale):
            return float(self._core.loss_scale)
        return float(self._core.current_scale())

    def is_enabled(self) -> bool:
        return True

    @property
    def last_step_skipped(self) -> Optional[bool]:
        """Whether the last finished step was skipped (None before the first)."""
        return None if self._last is None else bool(self._last["skipped"])

    @property
    def last_step(self) -> Optional[dict]:
        """The last verdict: step, loss, loss_scale, found_inf, first_nonfinite_layer (name), skipped,
        reason (why it was skipped: "overflow", or the backward pass that failed), phi, next_scale,
        state."""
        return self._last

    def layer_scales(self) -> List[dict]:
        """Per layer, for the last step: name, kind, s, unbound, S_in, S_out, underflow_rate (of the
        gradient it sent upstream, on recorded steps; else None), weight_grad_scale (r); `override`
        (its entry of `overrides=`, or None), `emulation` (what the plug-in rounds and scales there,
        docs/pytorch.md "The emulation boundary") and, with `shadow=True` on steps with statistics,
        `shadow`: what precision cost its gradients against an fp32 shadow of the backward pass —
        {"upstream": ..., "weight": ...}, each {underflow_mass, rel_error, cosine} (_shadow.py)."""
        rows = self._core.layer_scales()
        for row, layer in zip(rows, self._layers):
            row["override"] = self._overrides.get(layer.name)
            row["emulation"] = layer.emulation
            row["shadow"] = self._shadow_rows.get(layer.id)
        return rows

    @property
    def host_waits(self) -> int:
        """How many times the core has waited for the GPU since the Scaler was made (0 on the CPU):
        one for each statistic a decision needs at once (a controller's query, the maximum a
        weight-gradient factor or a join target is chosen from) and one a step for the measurements
        of every rounding together (docs/pytorch.md, "On a GPU")."""
        return int(self._core.host_waits)

    def loss_grad_stats(self) -> Optional[dict]:
        """The SPEC §3 statistics of the last step's loss gradient where it entered the model: the fp32
        values S0·g before their one rounding, against `grad_format` — zero, underflow, subnormal,
        normal, overflow, nonfinite, elements, underflow_rate (underflowed / non-zero finite), max_abs.
        On steps with statistics (`record_every`, or `trace_every` with a trace); None on the others
        and before the first step."""
        return self._core.loss_grad_stats()

    def state_dict(self) -> dict:
        """The policy's configuration and full state, every layer's cache included."""
        return {"gradscale": _core.__version__, "format": self.format, "grad_format": self.grad_format,
                "skipped_steps": self.skipped_steps, "core": json.loads(self._core.state()),
                "layer_shapes": self._layer_shapes()}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores what state_dict() returned (ValueError naming what differs: formats, the layer
        table and its parameters' shapes, the policy's configuration), and closes a step in progress."""
        if not isinstance(state_dict, dict) or "core" not in state_dict:
            raise ValueError("gradscale.torch: load_state_dict takes what Scaler.state_dict() returned "
                             f"(a dict with 'core'), got {type(state_dict).__name__}")
        for key, mine in (("format", self.format), ("grad_format", self.grad_format)):
            if state_dict.get(key) != mine:
                raise ValueError(f"gradscale.torch: the state dict was saved with {key} "
                                 f"{state_dict.get(key)!r}, this scaler uses {mine!r}")
        skipped = state_dict.get("skipped_steps", 0)
        if isinstance(skipped, bool) or not isinstance(skipped, int) or skipped < 0:
            raise ValueError(f"gradscale.torch: load_state_dict: 'skipped_steps' must be an integer >= 0, "
                             f"got {skipped!r}")
        shapes = state_dict.get("layer_shapes")
        mine = self._layer_shapes()
        if isinstance(shapes, dict) and sorted(shapes) == sorted(mine) and shapes != mine:
            differ = [n for n, shape in mine.items() if shapes[n] != shape]
            raise ValueError("gradscale.torch: the state dict was saved for layers with other parameter shapes "
                             f"(layers {', '.join(differ)})")
        self._tracker.stale()
        if self._step_open:
            self._core.abandon_step()
        self._core.restore_state(json.dumps(state_dict["core"]))
        self.skipped_steps = skipped
        self._reset_step()
        self._last = None

    def close(self, **results: Optional[float]) -> None:
        """Ends the trace (if any): the summary line and `trace`.json. `results` may give the run's
        train_loss, train_accuracy, test_loss and test_accuracy (null otherwise)."""
        if self._trace is None:
            return
        allowed = {"train_loss", "train_accuracy", "test_loss", "test_accuracy"}
        unknown = set(results) - allowed
        if unknown:
            raise ValueError(f"gradscale.torch: close() takes {sorted(allowed)}, got {sorted(unknown)}")
        summary = {key: results.get(key) for key in sorted(allowed)}
        if summary["train_loss"] is None and self._last is not None:
            summary["train_loss"] = self._last["loss"]
        summary.update(self._trace_counts)
        summary.update({"steps": self._core.steps, "wall_seconds": time.time() - self._started,
                        "scaler_seconds": self._scaler_seconds})
        # A NaN loss (the step that overflowed) is null in JSON.
        self._trace.finish(json.dumps({k: _finite_or_none(v) for k, v in summary.items()}, allow_nan=False))
        self._trace = None

    @property
    def trace_paths(self) -> Optional[tuple]:
        """(jsonl, json) of the open trace, or None."""
        return None if self._trace is None else (self._trace.jsonl_path, self._trace.json_path)

    def remove(self) -> None:
        """Detaches the scaler from the model (its hooks and forwards); ends the trace."""
        self.close()
        self._tracker.stale()
        for module in self._model.modules():
            for hooks in (module._forward_pre_hooks, module._forward_hooks):
                for key, hook in list(hooks.items()):
                    owner = getattr(hook, "__self__", None)
                    if owner is self or (isinstance(owner, CallWrapper) and owner.scaler is self):
                        del hooks[key]
        for wrapper in self._wrappers:
            wrapper.remove()
        self._wrappers = []
        for module, flag in self._fast_paths:
            module.activation_relu_or_gelu = flag
        self._fast_paths = []

    def __getstate__(self):
        raise TypeError("gradscale.torch: a Scaler (and a model it is attached to) cannot be pickled: save "
                        "model.state_dict() and scaler.state_dict() instead (torch.save of those works), or call "
                        "scaler.remove() before torch.save(model)")

    def __deepcopy__(self, memo):
        """A copy for a deep-copied model (an EMA copy, say): the copy's modules call this scaler's
        wrappers and hooks, so the scaler is copied with them — its core rebuilt from the same
        configuration and state — and drives the copy: the copy is scaled as the original is. A
        Scaler made for the copy later replaces it (one made for the original is refused)."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        skip = ("_core", "_tracker", "_process_group", "_trace", "_reducer", "_core_module")
        for key, value in self.__dict__.items():
            if key not in skip:
                setattr(new, key, copy.deepcopy(value, memo))
        new._process_group = self._process_group
        new._core_module = self._core_module
        new._trace = None  # a copy does not write into the original's trace
        new._attach_core()
        new._core.restore_state(self._core.state())
        new._reset_step()
        new._copied = True  # a Scaler made for the copy replaces this one
        return new

    # ---- internals -----------------------------------------------------------------------------
    def _attach_core(self) -> None:
        self._core = self._core_module.ExternalBackward(*self._core_args)
        self._reducer = None
        self._tracker = Tracker(self._core, self._layers, self.format)
        self._tracker.substitute = self.format != "fp32" or self.grad_format != "fp32" or self._shadow
        self._tracker.on_start = self._pass_started
        self._tracker.on_done = self._pass_done

    def _reset_step(self) -> None:
        self._step_open = False
        self._passes_done = 0
        self._failure: Optional[str] = None
        self._verdict: Optional[dict] = None
        self._stepped: Dict[int, bool] = {}
        self._unscaled: set = set()
        self._loss_value = 0.0

    def _layer_shapes(self) -> Dict[str, list]:
        return {l.name: [list(p.shape) for p in l.current_params()] for l in self._layers}

    def _pass_started(self, run: BackwardPass) -> None:
        self._loss_value += getattr(run, "loss_value", 0.0)

    def _pass_done(self, run: BackwardPass) -> None:
        self._passes_done += 1
        if self._unchecked_passes > 0:
            self._unchecked_passes -= 1
            self._warn_unemulated()

    def _warn_unemulated(self) -> None:
        """Names, once, a layer whose parameters received gradients although the layer never ran: its
        module's parameters were used without calling it (functionally, by another module), so those
        uses are not rounded there and take no local scale."""
        for row, layer in zip(self._core.layer_scales(), self._layers):
            if not layer.boundary or row["ran"] or layer.unemulated:
                continue
            if any(p.grad is not None for p in layer.current_params()):
                layer.unemulated = True
                warnings.warn(f"gradscale.torch: the parameters of layer '{layer.name}' "
                              f"({type(layer.module).__name__}) are used without calling it: those uses compute in "
                              "fp32 at the scale they meet, with exact gradients but no rounding to format= and no "
                              "local scale (layer_scales() says 'not emulated')", stacklevel=2)

    def _check_stale(self) -> None:
        """A pass still running between public calls raised inside backward: its step is skipped."""
        if self._tracker.stale() is not None and self._failure is None:
            self._failure = ("a backward pass of this step raised before it finished (its gradients are "
                             "partial): the step is skipped")

    def _expect_backwarded(self, call: str) -> None:
        if not self._step_open:
            raise RuntimeError(f"gradscale.torch: {call}() before scaler.scale(loss).backward()")
        if self._passes_done == 0 and self._failure is None:
            raise RuntimeError(f"gradscale.torch: {call}() after scale(loss) but before its backward()")

    def _take_verdict(self) -> None:
        if self._verdict is not None:
            return
        if self._failure is not None:
            s0 = self._core.loss_scale
            self._core.abandon_step()
            result = {"step": int(self._core.steps), "loss": self._loss_value, "loss_scale": s0, "found_inf": False,
                      "first_nonfinite_layer": None, "skipped": True, "reason": self._failure, "phi": None,
                      "next_scale": float(self._core.current_scale()), "scaler_seconds": 0.0,
                      "state": self._core.state()}
        else:
            group = _distributed.group_of(self._process_group)
            if group is not None:
                _distributed.agree(self._core, group)
            self._take_shadow()
            result = self._core.finish_step(self._loss_value)
            result["reason"] = "overflow" if result["skipped"] else None
            self._scaler_seconds += result["scaler_seconds"]
            if self._trace is not None:
                self._trace.write_step(self._core, result["step"], 1, result["loss"], result["loss_scale"],
                                       result["phi"], result["skipped"])
                self._trace_counts["skipped"] += int(result["skipped"])
                self._trace_counts["overflows"] += int(result["found_inf"])
            layer = result["first_nonfinite_layer"]
            result["first_nonfinite_layer"] = self._layers[layer].name if 0 <= layer < len(self._layers) else None
        if self._tracker.shadow is not None:  # a failed pass's step
            self._tracker.shadow = None
            self._shadow_rows = {}
        self._verdict = result
        self._last = result
        self.skipped_steps += int(result["skipped"])

    def _take_shadow(self) -> None:
        """The step's shadow figures into layer_scales() and the core's records (so into the trace)."""
        if self._tracker.shadow is None:
            self._shadow_rows = {}
            return
        self._shadow_rows = self._tracker.shadow.rows(len(self._layers))
        self._tracker.shadow = None
        for layer, row in self._shadow_rows.items():
            for kind, m in (row or {}).items():
                self._core.note_shadow(layer, kind == "weight", m["underflow_mass"], m["rel_error"], m["cosine"])

    def _applies_to(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether this optimizer steps. Not skipped: yes. Skipped for a failed pass: no. Skipped for
        an overflow: no when one of its gradients is not finite, or it holds a parameter of a layer
        where a value overflowed, or the overflow was at the loss gradient or at no layer; else yes
        (GradScaler skips an optimizer on its own gradients only)."""
        verdict = self._verdict
        if not verdict["skipped"]:
            return True
        if verdict["reason"] != "overflow":
            return False
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if any(p.grad is not None and _nonfinite(p.grad) for p in params):
            return False
        sites = self._core.overflow_buffer()
        layers = [i for i in range(len(self._layers)) if any(sites[3 + 4 * i + k] > 0 for k in range(3))]
        if sites[1] > 0 or not layers:
            return False
        mine = {id(p) for p in params}
        return not any(id(p) in mine for i in layers for p in self._layers[i].current_params())

    def _attach_reducer(self) -> None:
        """Under torch.distributed, once: the core reduces every statistic a scale is chosen from over
        the group as soon as it is computed (docs/pytorch.md, "Data-parallel"), so every rank takes
        the same S0, local scales and join targets."""
        group = _distributed.group_of(self._process_group) if self._agree_scales else None
        if group is None or self._reducer is not None:
            return
        size = torch.distributed.get_world_size(group)
        # A group of their own for the reductions inside backward: they never queue behind (or among)
        # DDP's bucket all-reduces, which run on the model's group while backward goes on.
        own = _distributed.own_group(group)
        self._reducer = self._core_module.Reducer(torch.distributed.get_rank(own), size,
                                                  _distributed.collective(own, size))
        self._core.set_reducer(self._reducer)

    def _model_pre_hook(self, module, inputs):
        if self._device.type == "cuda":  # the core's kernels run on PyTorch's current stream
            self._core.set_stream(torch.cuda.current_stream(self._device).cuda_stream)
        return None

    def _model_hook(self, module, inputs, output):
        if not torch.is_grad_enabled():
            return None
        tracker = self._tracker
        return map_tensors(output, self._device, lambda t: LossEdge.apply(t, tracker) if t.requires_grad else t)


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
            _json_text(value, f"Scaler(overrides={{{key!r}: ...}})")
        for layer in chosen:
            if isinstance(value, str) or isinstance(resolved.get(layer.name), str):
                resolved[layer.name] = value
            else:
                resolved[layer.name] = {**resolved.get(layer.name, {}), **value}
    return resolved


def _model_device(model: nn.Module) -> torch.device:
    """The one device of the model's parameters (ValueError when they are spread over several)."""
    devices = {p.device for p in model.parameters()}
    if len(devices) > 1:
        raise ValueError("gradscale.torch: the model's parameters are on several devices "
                         f"({', '.join(sorted(str(d) for d in devices))}); a Scaler works on one")
    return devices.pop() if devices else torch.device("cpu")  # no parameters: build_layers refused it


def _core_for(device: torch.device, cpu_target: bool):
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
