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

Every decision (S0, each layer's s, joins, rounding, found_inf, skip) is made by gradscale's C++ core
(`gradscale._core`); this module only finds where on the autograd graph to ask for it. Tensors in float32
on the CPU, or on a GPU when the core was built with CUDA: there the core's rounding, statistics and
maxima are lib/cuda's kernels, on PyTorch's current stream.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import itertools
import math
import json
import time
from typing import Any, Dict, List, Optional, Sequence, Union

import torch
from torch import nn

from .. import _core
from ._functions import Enter, Exit, LossEdge, round_forward
from ._layers import build_layers, trace_table
from ._session import Session

_IDLE, _SCALED, _BACKWARDED, _STEPPED = "idle", "scaled", "backwarded", "stepped"


def _policy_json(scaler: Union[str, Dict[str, Any]]) -> str:
    if isinstance(scaler, dict):
        return json.dumps(scaler)
    if isinstance(scaler, str):
        return json.dumps(scaler)  # CLI text: "torch", "static:1024", or a JSON object as text
    raise ValueError(f"gradscale.torch: scaler= takes a policy name or a configuration dict, got {scaler!r}")


class Scaler:
    """Per-layer loss scaling for `model` (see the module docstring).

    Args:
        model: the network; its leaf modules with parameters become layers (or `layers=`).
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
        The model's parameters must all be on one device, the CPU or a GPU (the core then works there).
        trace: write the per-layer trace of SPEC §8 to `trace`.jsonl while training (and `trace`.json
            at `close()`), in the `gradscale.trace/1` schema `gradscale inspect` and
            scripts/plot_trace.py read; `trace_every` steps with full statistics (plus every skipped,
            overflowing or rescaled step); `trace_hist` adds binade histograms.
    """

    def __init__(self, model: nn.Module, scaler: Union[str, Dict[str, Any]] = "torch", *, format: str = "fp16",
                 grad_format: Optional[str] = None, layers: Optional[Sequence[Union[str, nn.Module]]] = None,
                 weight_grads: str = "format", record_every: int = 10, process_group: Any = None,
                 trace: Optional[str] = None, trace_every: int = 10, trace_hist: bool = False,
                 agree_scales: bool = True, _cpu_target: bool = False):
        if not isinstance(model, nn.Module):
            raise ValueError(f"gradscale.torch: Scaler needs an nn.Module, got {type(model).__name__}")
        if weight_grads not in ("format", "fp32"):
            raise ValueError(f"gradscale.torch: weight_grads must be 'format' or 'fp32', got {weight_grads!r}")
        if not isinstance(record_every, int) or record_every < 0:
            raise ValueError(f"gradscale.torch: record_every must be an integer >= 0, got {record_every!r}")
        self.format = _core.check_format(format)
        self.grad_format = _core.check_format(grad_format) if grad_format is not None else self.format
        self.record_every = record_every
        self._process_group = process_group
        if not isinstance(agree_scales, bool):
            raise ValueError(f"gradscale.torch: agree_scales must be True or False, got {agree_scales!r}")
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
        self._trace = None
        if trace is not None:
            if not isinstance(trace_every, int) or trace_every < 1:
                raise ValueError(f"gradscale.torch: trace_every must be an integer >= 1, got {trace_every!r}")
            header = {"version": _core.__version__,
                      "config": {"model": type(model).__name__, "writer": "gradscale.torch",
                                 "torch": torch.__version__},
                      "format": self.format, "grad_format": self.grad_format,
                      "scaler": json.loads(self._core.scaler_config()), "seed": int(torch.initial_seed()),
                      "layers": trace_table(self._layers, model)}
            self._trace = self._core_module.TraceWriter(str(trace), json.dumps(header), trace_every,
                                                        bool(trace_hist))
            self._trace_counts = {"skipped": 0, "overflows": 0}  # every such step is traced
        self._started = time.time()
        self._phase = _IDLE
        self.skipped_steps = 0  # steps skipped since the scaler was made (or its state loaded)
        self._scaler_seconds = 0.0
        self._unscaled: set = set()
        self._last: Optional[dict] = None
        self._loss_value = 0.0
        self._masters: Optional[List[tuple]] = None
        self._calls = itertools.count()
        self._open_calls: Dict[int, List[int]] = {}
        self._pending_calls: Dict[int, int] = {}  # layer id -> the call its pre-hook opened, for its forward
        self._handles = []
        for layer in self._layers:
            if layer.boundary:
                self._handles.append(layer.module.register_forward_pre_hook(self._enter_hook(layer.id)))
                self._handles.append(layer.module.register_forward_hook(self._exit_hook(layer.id)))
                self._handles.append(_KeywordInputs.install(self, layer.id, layer.module))
        self._handles.append(model.register_forward_pre_hook(self._model_pre_hook))
        self._handles.append(model.register_forward_hook(self._model_hook))

    # ---- the GradScaler API --------------------------------------------------------------------
    def scale(self, outputs: torch.Tensor) -> torch.Tensor:
        """Opens the step (or adds a micro-batch to it) and prepares the autograd graph of `outputs`
        (the scalar loss) for per-layer scaling. Returns `outputs` unchanged: S0 is applied to the loss
        gradient where it enters the model. No host-device synchronisation (CPU only)."""
        if not isinstance(outputs, torch.Tensor):
            raise ValueError(f"gradscale.torch: scale() takes the loss tensor, got {type(outputs).__name__}")
        if outputs.numel() != 1:
            raise ValueError(f"gradscale.torch: scale() takes a scalar loss, got a tensor of shape "
                             f"{tuple(outputs.shape)} (reduce it with .mean() or .sum())")
        if outputs.grad_fn is None:
            raise ValueError("gradscale.torch: the loss has no autograd graph (computed under no_grad, or "
                             "from nothing that requires grad)")
        if self._phase in (_STEPPED,):
            raise RuntimeError("gradscale.torch: scale() after step() — call update() first")
        again = self._session.instrumented(outputs.grad_fn)
        if self._session.instrument([outputs.grad_fn]) == 0:
            raise ValueError("gradscale.torch: the loss does not depend on the model's outputs "
                             f"({type(self._model).__name__} returned nothing this loss reads)")
        if self._phase == _IDLE:
            self._attach_reducer()
            # The layer graph the walk found, for SPEC §6.5's charging (given between steps: a graph
            # that grows in a later micro-batch is given at the next step).
            graph = self._session.take_layer_graph()
            if graph is not None:
                self._core.set_layer_inputs(graph)
            record = self.record_every > 0 and self._core.steps % self.record_every == 0
            if self._trace is not None:
                record = self._trace.samples(self._core.steps + 1)
            self._core.begin_step(record)
            self._session.active = True
            self._unscaled.clear()
        if not again:
            self._loss_value += float(outputs.detach())
        self._phase = _SCALED
        return outputs

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Marks `optimizer` as unscaled. Its parameters' `.grad` already hold true gradients (each
        layer's part was divided by its own scale during backward), so clipping may follow now."""
        self._expect_backwarded("unscale_")
        if id(optimizer) in self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        self._unscaled.add(id(optimizer))

    def step(self, optimizer: torch.optim.Optimizer, *args, **kwargs) -> bool:
        """The verdict of the step's policy (found_inf in any gradient → skip, with the policy's
        back-off), then `optimizer.step(*args, **kwargs)` unless skipped. Returns True when applied."""
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if gradscale.torch.Scaler is enabled.")
        self._expect_backwarded("step")
        self._finish()
        applied = not self._last["skipped"]
        if applied:
            optimizer.step(*args, **kwargs)
        self._phase = _STEPPED
        return applied

    def update(self, new_scale: Optional[float] = None) -> None:
        """Closes the step. (The policy already updated its scales with step()'s verdict.)"""
        if new_scale is not None:
            raise ValueError("gradscale.torch: update(new_scale) is not supported: S0 and every layer's scale "
                             "belong to the policy (configure it with scaler=, e.g. 'static:1024')")
        if self._phase == _SCALED:
            raise RuntimeError("gradscale.torch: update() after scale() but before backward()")
        if self._phase == _BACKWARDED:
            self._finish()  # no step(): the verdict is still taken, the optimizer untouched
        self._restore_masters()
        self._phase = _IDLE

    def get_scale(self) -> float:
        """S0: the scale at the loss for the next step (the one used by the last step while it is open)."""
        if self._phase in (_SCALED, _BACKWARDED) and not math.isnan(self._core.loss_scale):
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
        phi, next_scale, state."""
        return self._last

    def layer_scales(self) -> List[dict]:
        """Per layer, for the last step: name, kind, s, unbound, S_in, S_out, underflow_rate (of the
        gradient it sent upstream, on recorded steps; else None)."""
        return self._core.layer_scales()

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
                "skipped_steps": self.skipped_steps, "core": json.loads(self._core.state())}

    def load_state_dict(self, state_dict: dict) -> None:
        if not isinstance(state_dict, dict) or "core" not in state_dict:
            raise ValueError("gradscale.torch: load_state_dict takes what Scaler.state_dict() returned "
                             f"(a dict with 'core'), got {type(state_dict).__name__}")
        for key, mine in (("format", self.format), ("grad_format", self.grad_format)):
            if state_dict.get(key) != mine:
                raise ValueError(f"gradscale.torch: the state dict was saved with {key} "
                                 f"{state_dict.get(key)!r}, this scaler uses {mine!r}")
        self._core.restore_state(json.dumps(state_dict["core"]))
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self._phase = _IDLE
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
        self._trace.finish(json.dumps(summary))
        self._trace = None

    @property
    def trace_paths(self) -> Optional[tuple]:
        """(jsonl, json) of the open trace, or None."""
        return None if self._trace is None else (self._trace.jsonl_path, self._trace.json_path)

    def remove(self) -> None:
        """Detaches the scaler from the model (its hooks), restoring the master weights; ends the trace."""
        self.close()
        self._restore_masters()
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __deepcopy__(self, memo):
        """A copy for a deep-copied model (an EMA copy, say): the hooks the copy's modules hold are
        this scaler's methods, so the scaler is copied with them — its core rebuilt from the same
        configuration and state — and drives the copy."""
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        for key, value in self.__dict__.items():
            if key not in ("_core", "_session", "_calls", "_process_group", "_trace", "_reducer", "_core_module"):
                setattr(new, key, copy.deepcopy(value, memo))
        new._process_group = self._process_group
        new._core_module = self._core_module
        new._trace = None  # a copy does not write into the original's trace
        new._calls = itertools.count()
        new._attach_core()
        new._core.restore_state(self._core.state())
        return new

    # ---- internals -----------------------------------------------------------------------------
    def _attach_core(self) -> None:
        self._core = self._core_module.ExternalBackward(*self._core_args)
        self._reducer = None
        self._session = Session(self._core, self._layers, self.format)
        self._session.on_backward_done = self._backward_done

    def _expect_backwarded(self, call: str) -> None:
        if self._phase == _IDLE:
            raise RuntimeError(f"gradscale.torch: {call}() before scaler.scale(loss).backward()")
        if self._phase == _SCALED:
            raise RuntimeError(f"gradscale.torch: {call}() after scale(loss) but before its backward()")
        if self._phase == _STEPPED:
            raise RuntimeError(f"gradscale.torch: {call}() after step() — call update() first")

    def _finish(self) -> None:
        group = self._group()
        if group is not None:
            # One all-reduce per step (docs/pytorch.md, "Data-parallel"): every rank takes the verdict
            # of the group, so no rank applies a step another skips, and every rank charges the same
            # overflows to the same layers (SPEC §6.5).
            verdict = self._core.agreement_buffer()
            overflows = self._core.overflow_buffer()
            buf = torch.tensor(verdict + overflows, dtype=torch.float64, device=_collective_device(group))
            torch.distributed.all_reduce(buf, group=group)
            summed = buf.tolist()
            self._core.agree(summed[:len(verdict)])
            self._core.agree_overflows(summed[len(verdict):])
        result = self._core.finish_step(self._loss_value)
        self._scaler_seconds += result["scaler_seconds"]
        if self._trace is not None:
            self._trace.write_step(self._core, result["step"], 1, result["loss"], result["loss_scale"],
                                   result["phi"], result["skipped"])
            self._trace_counts["skipped"] += int(result["skipped"])
            self._trace_counts["overflows"] += int(result["found_inf"])
        layer = result["first_nonfinite_layer"]
        result["first_nonfinite_layer"] = self._layers[layer].name if 0 <= layer < len(self._layers) else None
        self._last = result
        self.skipped_steps += int(result["skipped"])
        self._loss_value = 0.0
        self._session.active = False

    def _group(self):
        """The process group the verdict is agreed over, or None (one process)."""
        if self._process_group is False or not torch.distributed.is_available():
            return None
        if not torch.distributed.is_initialized():
            return None
        group = self._process_group or torch.distributed.group.WORLD
        return group if torch.distributed.get_world_size(group) > 1 else None

    def _attach_reducer(self) -> None:
        """Under torch.distributed, once: the core reduces every statistic a scale is chosen from over
        the group as soon as it is computed (docs/pytorch.md, "Data-parallel"), so every rank takes
        the same S0, local scales and join targets."""
        group = self._group() if self._agree_scales else None
        if group is None or self._reducer is not None:
            return
        size = torch.distributed.get_world_size(group)
        self._reducer = self._core_module.Reducer(torch.distributed.get_rank(group), size, _collective(group, size))
        self._core.set_reducer(self._reducer)

    def _backward_done(self) -> None:
        self._restore_masters()
        self._phase = _BACKWARDED

    def _use_working_weights(self) -> None:
        if self.format == "fp32" or self._masters is not None:
            return
        self._masters = []
        for p in self._model.parameters():
            master = p.data
            p.data = round_forward(master, self.format, self._core)
            self._masters.append((p, master))

    def _restore_masters(self) -> None:
        if self._masters is None:
            return
        for p, master in self._masters:
            p.data = master
        self._masters = None

    def _model_pre_hook(self, module, inputs):
        if self._device.type == "cuda":  # the core's kernels run on PyTorch's current stream
            self._core.set_stream(torch.cuda.current_stream(self._device).cuda_stream)
        self._use_working_weights()
        return None

    def _model_hook(self, module, inputs, output):
        if not torch.is_grad_enabled():
            self._restore_masters()  # inference: no backward will read the working weights
            return None
        return _map_tensors(output, self._device,
                            lambda t: LossEdge.apply(t, self._session) if t.requires_grad else t)

    # The layer hooks are partials of bound methods, not closures: copy.deepcopy(model) then binds the
    # copy's hooks to the scaler's copy (a closure would be shared, and drive this scaler).
    def _enter_hook(self, layer_id: int):
        return functools.partial(self._enter_call, layer_id)

    def _enter_call(self, layer_id: int, module, inputs):
        call = next(self._calls)
        self._open_calls.setdefault(layer_id, []).append(call)
        self._pending_calls[layer_id] = call
        return tuple(self._enter(layer_id, call, x) for x in inputs)

    def _enter(self, layer_id: int, call: int, x):
        """One argument of a layer call: a floating tensor gets its `Enter` (rounded to `format`)."""
        grad = torch.is_grad_enabled()
        return _wrap(x, self._device, lambda t: Enter.apply(t, self._session, layer_id, call)
                     if grad and t.requires_grad else round_forward(t, self.format, self._core))

    def _enter_keywords(self, layer_id: int, kwargs: dict) -> dict:
        """The keyword arguments of the call the layer's pre-hook just opened, treated as its positional
        ones are. A forward called directly (not through the module's __call__, so no hook ran and no
        Exit will follow) is left alone."""
        call = self._pending_calls.pop(layer_id, None)
        if call is None or not kwargs:
            return kwargs
        return {k: self._enter(layer_id, call, v) for k, v in kwargs.items()}

    def _exit_hook(self, layer_id: int):
        return functools.partial(self._exit_call, layer_id)

    def _exit_call(self, layer_id: int, module, inputs, output):
        stack = self._open_calls.get(layer_id)
        call = stack.pop() if stack else -1
        grad = torch.is_grad_enabled()
        return _map_tensors(output, self._device, lambda t: Exit.apply(t, self._session, layer_id, call)
                            if grad and t.requires_grad else round_forward(t, self.format, self._core))


def _collective_device(group) -> torch.device:
    """Where a collective's buffer goes: NCCL reduces CUDA tensors only, the other backends host ones."""
    if torch.distributed.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _collective(group, size: int):
    """The collectives gradscale's data-parallel reductions need (lib/dist/communicator.h), on `group`:
    what the core's Reducer calls with (op, values) and expects the result of."""
    dist = torch.distributed
    device = _collective_device(group)
    ops = {"sum_int": (torch.int64, dist.ReduceOp.SUM), "sum_float": (torch.float32, dist.ReduceOp.SUM),
           "max": (torch.float64, dist.ReduceOp.MAX)}

    def run(op: str, values: list) -> list:
        if op == "barrier":
            dist.barrier(group=group)
            return []
        if op == "gather":
            mine = torch.tensor(values, dtype=torch.float64, device=device)
            every = [torch.empty_like(mine) for _ in range(size)]
            dist.all_gather(every, mine, group=group)
            return torch.cat(every).tolist()
        if op not in ops:
            raise ValueError(f"gradscale.torch: unknown collective {op!r}")
        dtype, reduce_op = ops[op]
        buf = torch.tensor(values, dtype=dtype, device=device)
        dist.all_reduce(buf, op=reduce_op, group=group)
        return buf.tolist()
    return run


class _KeywordInputs:
    """A boundary layer's `forward`, set on the module instance: torch 1.13's forward pre-hooks see the
    positional arguments only, so the tensors a layer is given by keyword get their `Enter` here, in
    the call its pre-hook opened (module.__call__ runs the pre-hooks, then `self.forward`). It calls
    the forward the module had (its class's, or one already set on the instance). A plain object
    holding the scaler and the module, so `copy.deepcopy(model)` gives the copy its own."""

    def __init__(self, scaler: "Scaler", layer_id: int, module: nn.Module):
        self.scaler = scaler
        self.layer_id = layer_id
        self.module = module
        self.inner = module.__dict__.get("forward")  # an instance-level forward set before ours, if any

    @classmethod
    def install(cls, scaler: "Scaler", layer_id: int, module: nn.Module) -> "_KeywordInputs":
        wrapper = cls(scaler, layer_id, module)
        module.forward = wrapper
        return wrapper

    def __call__(self, *args, **kwargs):
        kwargs = self.scaler._enter_keywords(self.layer_id, kwargs)
        # Under torch.autocast the layer still computes in float32 on values of `format` (SPEC §4-§5:
        # its backward product must reach the core in fp32, to be multiplied by s before its one
        # rounding); what runs outside the layers keeps autocast's dtype.
        with _autocast_off(self.scaler._device):
            if self.inner is not None:
                return self.inner(*args, **kwargs)
            return type(self.module).forward(self.module, *args, **kwargs)

    def remove(self) -> None:
        """Puts the module's own forward back (as a hook handle's remove() does)."""
        if self.module.__dict__.get("forward") is self:
            if self.inner is None:
                del self.module.forward
            else:
                self.module.forward = self.inner


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


def _autocast_off(device: torch.device):
    """A context without autocast on `device` when autocast is on there (else nothing)."""
    try:
        on = torch.is_autocast_enabled(device.type)  # torch >= 2.4
    except TypeError:
        on = torch.is_autocast_cpu_enabled() if device.type == "cpu" else torch.is_autocast_enabled()
    return torch.autocast(device.type, enabled=False) if on else contextlib.nullcontext()


def _wrap(x, device: torch.device, fn):
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        if x.device != device:
            raise RuntimeError(f"gradscale.torch: a tensor on {x.device} met layers whose parameters are on "
                               f"{device}")
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # from an op under autocast: a layer boundary holds float32 (values of a format)
        if x.dtype != torch.float32:
            raise TypeError(f"gradscale.torch emulates every format in float32 tensors; got {x.dtype} "
                            "(keep the model in float32 and choose format= / grad_format=)")
        return fn(x)
    return x


def _map_tensors(value, device: torch.device, fn):
    if isinstance(value, torch.Tensor):
        return _wrap(value, device, fn)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_map_tensors(v, device, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(_map_tensors(v, device, fn) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _map_tensors(v, device, fn)) for k, v in value.items())
    return value
