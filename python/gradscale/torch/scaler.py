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

This module is the Scaler and its step; beside it: `_arguments` (Scaler(...)'s arguments checked),
`_attach` (its hooks on the model, and remove()), `_trace` (the SPEC §8 trace), `_distributed` (the
process group's reductions and verdict), `_shadow` (the fp32 shadow), `_tracker` (the passes).
"""
from __future__ import annotations

import copy
import json
import math
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from .. import _core
from . import _distributed
from ._arguments import (check_format, check_options, core_for, model_device, policy_json, refuse_element_wise,
                         resolve_overrides)
from ._attach import attach, detach, refuse_attached
from ._backward_pass import BackwardPass, _install_backward_wrapper
from ._boundary import map_tensors
from ._functions import LossEdge
from ._layers import build_layers, warn_unemulated
from ._shadow import run_shadow, take_shadow
from ._trace import Trace
from ._tracker import Tracker


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
        refuse_attached(model)
        check_options(weight_grads, record_every, trace_every, agree_scales, trace_hist, shadow)
        self.format = check_format("format", format)
        self.grad_format = check_format("grad_format", grad_format) if grad_format is not None else self.format
        self.record_every = record_every
        self._shadow = shadow
        if process_group is not None and process_group is not False and not (
                torch.distributed.is_available() and isinstance(process_group, torch.distributed.ProcessGroup)):
            raise TypeError(f"gradscale.torch: process_group= takes a torch.distributed process group, None "
                            f"(the world) or False, got {type(process_group).__name__}")
        self._process_group = process_group
        self._agree_scales = agree_scales
        self._model = model
        self._layers = build_layers(model, layers)
        self._every_module = layers is None  # the table holds every module with parameters
        self._outside: set = set()  # ids of leaves of no layer, looked up in the model once
        self._device = model_device(model)
        self._device_type = self._device.type  # (read at every layer call)
        # _cpu_target (the tests'): the core over lib/cuda's CPU execution target, whose "device memory"
        # is the host's, so the CUDA path runs on CPU tensors (tests/cuda_on_cpu, docs/pytorch.md).
        self._core_module, core_device = core_for(self._device, _cpu_target)
        self._core_args = ([l.row() for l in self._layers], self.format, self.grad_format, weight_grads == "format",
                           policy_json(scaler), core_device)
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
        refuse_element_wise(config)
        self._trace: Optional[Trace] = None
        if trace is not None:
            self._trace = Trace(self._core_module, self._core, trace, model, self._layers, trace_every, trace_hist)
        self._shadow_rows: Dict[int, Optional[dict]] = {}
        self._started = time.time()
        self.skipped_steps = 0  # steps skipped since the scaler was made (or its state loaded)
        self._scaler_seconds = 0.0
        self._last: Optional[dict] = None
        self._unchecked_passes = 3  # the first passes are checked for layers used without being called
        self._reset_step()
        _install_backward_wrapper()
        self._wrappers, self._fast_paths = attach(self, model, self._layers)

    # ---- the GradScaler API --------------------------------------------------------------------
    def scale(self, outputs: torch.Tensor) -> torch.Tensor:
        """Opens the step (or adds a backward pass to it) and prepares the autograd graph of `outputs`
        (the scalar loss) for per-layer scaling. Returns `outputs` unchanged: S0 is applied to the loss
        gradient where it enters the model. The loss's value is read with the step's verdict (on a GPU,
        not a wait of its own)."""
        if not isinstance(outputs, torch.Tensor):
            raise TypeError(f"gradscale.torch: scale() takes the loss tensor, got {type(outputs).__name__}")
        if outputs.numel() != 1:
            raise ValueError(f"gradscale.torch: scale() takes a scalar loss, got a tensor of shape "
                             f"{tuple(outputs.shape)} (reduce it with .mean() or .sum())")
        if getattr(self, "_removed", False):
            raise RuntimeError("gradscale.torch: scale() on a Scaler after its remove(): it no longer scales the "
                               "model (train it as plain PyTorch, or make a new Scaler)")
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
                             f"({type(self._model).__name__} returned nothing this loss reads: the Scaler's "
                             "model must be called, not only its submodules — a container such as "
                             "nn.ModuleDict needs a module whose forward runs its parts)")
        if not hasattr(run, "loss_value"):
            run.loss_value = outputs.detach().clone()  # a tensor: read with the verdict
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
            self._tracker.count_joins()  # the last step's scale handles end here
            if self._tracker.pool is not None:
                self._tracker.pool.trim()  # what stayed unused for a whole step goes back to the system
            self._core.begin_step(record)
            self._step_open = True
            self._tracker.shadow = None
            if self._shadow and record:
                run_shadow(self._tracker, self._model, outputs)
        return outputs

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
        if not callable(getattr(optimizer, "step", None)) or not hasattr(optimizer, "param_groups"):
            raise TypeError(f"gradscale.torch: step() takes the optimizer (a torch.optim.Optimizer), got "
                            f"{type(optimizer).__name__}")
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
        try:
            core_state = json.dumps(state_dict["core"], allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ValueError(f"gradscale.torch: load_state_dict: the state dict's 'core' is not what "
                             f"Scaler.state_dict() writes ({e})") from e
        if self._step_open:
            # Checked on a core of its own first: a state the core refuses leaves the step in progress
            # (and so its update) as it was; restore_state itself changes nothing when it refuses.
            self._checked_restore(self._core_module.ExternalBackward(*self._core_args), core_state)
        self._tracker.stale()
        if self._step_open:
            self._core.abandon_step()
        self._checked_restore(self._core, core_state)
        self.skipped_steps = skipped
        self._reset_step()
        self._last = None

    @staticmethod
    def _checked_restore(core, core_state: str) -> None:
        try:
            core.restore_state(core_state)
        except (ValueError, RuntimeError) as e:
            raise ValueError(f"gradscale.torch: load_state_dict: {e}") from e

    def close(self, **results: Optional[float]) -> None:
        """Ends the trace (if any): the summary line and `trace`.json. `results` may give the run's
        train_loss, train_accuracy, test_loss and test_accuracy (null otherwise)."""
        if self._trace is None:
            return
        self._trace.finish(results, self._last, self._core.steps, time.time() - self._started, self._scaler_seconds)
        self._trace = None

    @property
    def trace_paths(self) -> Optional[tuple]:
        """(jsonl, json) of the open trace, or None."""
        return None if self._trace is None else self._trace.paths

    def remove(self) -> None:
        """Detaches the scaler from the model (its hooks and forwards); ends the trace."""
        self.close()
        self._tracker.stale()
        self._tracker.release_buffers()
        detach(self, self._model, self._wrappers, self._fast_paths)
        self._wrappers = []
        self._fast_paths = []
        self._removed = True

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
        if self._core_args[5] == "cpu":
            self._tracker.pool = self._core_module.HostPool()
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
        self._losses: List[torch.Tensor] = []  # the losses of the step's passes, read with the verdict

    def _layer_shapes(self) -> Dict[str, list]:
        return {l.name: [list(p.shape) for p in l.current_params()] for l in self._layers}

    def _pass_started(self, run: BackwardPass) -> None:
        if hasattr(run, "loss_value"):
            self._losses.append(run.loss_value)

    def _loss_value(self) -> float:
        """The step's loss (the sum of its passes' losses), read now: on a GPU after its backward, which
        the verdict waits for anyway."""
        return float(sum(float(loss) for loss in self._losses))

    def _pass_done(self, run: BackwardPass) -> None:
        self._passes_done += 1
        if run.unowned and self._every_module:
            self._name_new_modules(run.unowned)
        if self._unchecked_passes > 0:
            self._unchecked_passes -= 1
            warn_unemulated(self._layers, self._core.layer_scales(), run.param_layers)

    def _name_new_modules(self, leaves: List[torch.Tensor]) -> None:
        """Warns, once each, of a module of the model whose parameters a pass reached though no layer of
        this Scaler holds them: one added or put in a layer's place after Scaler(model), which is not
        emulated (a parameter outside the model, a temperature say, is no module's: no warning)."""
        new = [p for p in leaves if id(p) not in self._outside]
        if not new:
            return
        self._outside.update(id(p) for p in new)
        ids = {id(p) for p in new}
        for name, module in self._model.named_modules():
            if any(id(p) in ids for p in module._parameters.values() if p is not None):
                warnings.warn(f"gradscale.torch: module '{name or 'model'}' ({type(module).__name__}) was added to "
                              "the model, or put in a layer's place, after Scaler(model): it is no layer of this "
                              "Scaler, so it computes in fp32 with no rounding to format= and no local scale "
                              "(its gradients are exact); call scaler.remove() and make a new Scaler to emulate it",
                              stacklevel=3)

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
            result = {"step": int(self._core.steps), "loss": self._loss_value(), "loss_scale": s0, "found_inf": False,
                      "first_nonfinite_layer": None, "skipped": True, "reason": self._failure, "phi": None,
                      "next_scale": float(self._core.current_scale()), "scaler_seconds": 0.0,
                      "state": self._core.state()}
        else:
            group = _distributed.group_of(self._process_group)
            if group is not None:
                _distributed.agree(self._core, group)
            self._shadow_rows = take_shadow(self._tracker, self._core, len(self._layers))
            result = self._core.finish_step(self._loss_value())
            result["reason"] = "overflow" if result["skipped"] else None
            self._scaler_seconds += result["scaler_seconds"]
            if self._trace is not None:
                self._trace.write_step(self._core, result)
            layer = result["first_nonfinite_layer"]
            result["first_nonfinite_layer"] = self._layers[layer].name if 0 <= layer < len(self._layers) else None
        if self._tracker.shadow is not None:  # a failed pass's step
            self._tracker.shadow = None
            self._shadow_rows = {}
        self._verdict = result
        self._last = result
        self.skipped_steps += int(result["skipped"])

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
        """Under torch.distributed with agree_scales, once: the core's Reducer (_distributed.reducer)."""
        if self._reducer is not None or not self._agree_scales:
            return
        self._reducer = _distributed.reducer(self._core_module, self._process_group)
        if self._reducer is not None:
            self._core.set_reducer(self._reducer)

    def _model_pre_hook(self, module, inputs):
        if self._device.type == "cuda":  # the core's kernels run on PyTorch's current stream
            self._core.set_stream(torch.cuda.current_stream(self._device).cuda_stream)
        elif self._tracker.pool is not None and not torch.is_grad_enabled():
            # A forward without a graph (evaluation) trims the pool as scale() does in training: a loop
            # of them, over batches of changing shapes, holds no more than the last ones need.
            self._tracker.pool.trim()
        return None

    def _model_hook(self, module, inputs, output):
        if not torch.is_grad_enabled():
            return None
        tracker = self._tracker
        return map_tensors(output, self._device, lambda t: LossEdge.apply(t, tracker) if t.requires_grad else t)
