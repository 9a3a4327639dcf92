"""A layer's call under gradscale: its inputs and outputs rounded at the boundary, its parameters
replaced by working copies for the length of its own forward, and nothing left behind.

- The forward pre-hook opens the call (`LayerCall`) and gives each input its `Enter`.
- `CallWrapper`, set as the module's `forward` (module.__call__ runs the pre-hooks, then
  `self.forward`, then the forward hooks), gives keyword inputs their `Enter` (torch 1.13's pre-hooks
  see positional arguments only), then — in a try/finally around the module's own forward, as
  `torch.func.functional_call` does — puts a working copy of each parameter in its place (one
  `WorkingWeights` node for the call), and the Parameter back afterwards. Outside the call the
  model's parameters are the fp32 masters, always.
- The forward hook closes the call and gives each output its `Exit`.

Under torch.autograd's no_grad the same boundaries round, without nodes.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.module import _global_forward_hooks

from ._functions import Enter, Exit, WorkingWeights, is_dense, round_forward


def refuse_compile() -> None:
    """torch.compile traces with tensors that have no memory (FakeTensor), which the core reads through
    data_ptr: refused with a message instead of failing deep inside the trace."""
    compiler = torch.__dict__.get("compiler")  # (getattr would build an AttributeError where torch has none)
    if compiler is not None and getattr(compiler, "is_compiling", None) is not None and compiler.is_compiling():
        raise RuntimeError("gradscale.torch: a model with a Scaler cannot run under torch.compile (the core reads "
                           "each tensor's memory, which a compiled graph's tracing tensors do not have); run it "
                           "eagerly, or compile a copy after scaler.remove()")
    if torch.jit.is_tracing():
        # A trace records the tensor operations only: the core's roundings, which write through
        # data_ptr, would be missing from it, and the traced model would compute something else.
        raise RuntimeError("gradscale.torch: a model with a Scaler cannot be traced by torch.jit.trace (the "
                           "trace would leave out the Scaler's roundings, which the core does outside torch's "
                           "operations); trace a copy after scaler.remove()")


class LayerCall:
    """One call of a layer: pairs its Enter and Exit nodes and holds the working weight its
    controller reads in backward (the master may change before then)."""
    __slots__ = ("layer_id", "weight", "entered", "left", "output", "__weakref__")

    def __init__(self, layer_id: int):
        self.layer_id = layer_id
        self.weight: Optional[torch.Tensor] = None
        self.entered = None  # attention: id(input) -> (input, its Enter), while the call starts
        self.left = False  # attention: its output went through its Exit inside the call
        self.output = None  # a direct call's result (CallWrapper.direct), until the forward hook


def checked_float32(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A floating tensor at a layer boundary, checked for device and dtype: x itself in float32."""
    if x.device != device:
        raise RuntimeError(f"gradscale.torch: a tensor on {x.device} met layers whose parameters are on "
                           f"{device}")
    if x.dtype is not torch.float32:
        if x.dtype in (torch.float16, torch.bfloat16):
            x = x.float()  # from an op under autocast: a layer boundary holds float32 (values of a format)
        else:
            raise TypeError(f"gradscale.torch emulates every format in float32 tensors; got {x.dtype} "
                            "(keep the model in float32 and choose format= / grad_format=)")
    return x


def wrap_tensor(x, device: torch.device, fn):
    """`fn(x)` for a floating tensor (checked for device and dtype), `x` itself otherwise."""
    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return fn(checked_float32(x, device))
    return x


def map_tensors(value, device: torch.device, fn):
    if isinstance(value, torch.Tensor):
        return wrap_tensor(value, device, fn)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(map_tensors(v, device, fn) for v in value))
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(v, device, fn) for v in value)
    if isinstance(value, dict):
        return type(value)((k, map_tensors(v, device, fn)) for k, v in value.items())
    return value


def _autocast_query():
    """torch.is_autocast_enabled(device_type) where torch has it (>= 2.4), else its per-device forms:
    chosen once, not by an exception at every layer call."""
    try:
        torch.is_autocast_enabled("cpu")
        return torch.is_autocast_enabled
    except TypeError:
        return lambda device_type: (torch.is_autocast_cpu_enabled() if device_type == "cpu"
                                    else torch.is_autocast_enabled())


_autocast_enabled = _autocast_query()


_NOTHING = contextlib.nullcontext()  # (reusable: one for every call without autocast)


def autocast_off(device_type: str):
    """A context without autocast on devices of `device_type` when autocast is on there (else nothing)."""
    return torch.autocast(device_type, enabled=False) if _autocast_enabled(device_type) else _NOTHING


def _set_param(module: nn.Module, name: str, value) -> None:
    """module.<name> = value without nn.Module's check that a parameter slot holds a Parameter; an RNN's
    cached list of its weights follows (RNNBase.__setattr__ does the same)."""
    module._parameters[name] = value
    names = module.__dict__.get("_flat_weights_names")
    if names is not None and name in names:
        module._flat_weights[names.index(name)] = value


# torch.nn's Linear and ConvNd forward, as functions of the module, the input and the two parameters:
# what their own forward computes (the same function, looked up at each call as theirs does).
_DIRECT = {
    nn.Linear: lambda module, x, weight, bias: F.linear(x, weight, bias),
    nn.Conv1d: lambda module, x, weight, bias: module._conv_forward(x, weight, bias),
    nn.Conv2d: lambda module, x, weight, bias: module._conv_forward(x, weight, bias),
    nn.Conv3d: lambda module, x, weight, bias: module._conv_forward(x, weight, bias),
}


class _IdentityProjection:
    """While an attention call runs, `torch.nn.functional.linear` returns its input when its weight is
    one of the identity matrices put in the place of out_proj's weight: F.multi_head_attention_forward
    then hands the attention's output on as it is (the values exactly, -0.0 included), instead of
    multiplying it by I — a GEMM and its backward, as costly as out_proj itself at transformer widths.
    Any other call goes to the `linear` it replaced (torch's own). Installed for the length of the
    outermost attention call of any thread (a count under a lock), and the replaced function put back
    afterwards; a path that calls torch's kernels directly (MultiheadAttention's fused inference path)
    multiplies by the identity, which gives the same values but -0.0."""

    _lock = threading.Lock()
    _depth = 0
    _original = F.linear  # what `linear` passes other calls to: F.linear as it was when installed
    _identities: Dict[int, torch.Tensor] = {}  # id -> the identity itself (held: its id stays unique)

    @classmethod
    def linear(cls, input, weight, bias=None):  # noqa: A002 (torch's own argument names)
        if cls._identities.get(id(weight)) is weight:
            return input
        return cls._original(input, weight, bias)

    @classmethod
    @contextlib.contextmanager
    def installed(cls, identity: torch.Tensor):
        with cls._lock:
            if cls._depth == 0:
                cls._original = F.linear
                F.linear = cls.linear
            cls._depth += 1
            cls._identities[id(identity)] = identity
        try:
            yield
        finally:
            with cls._lock:
                cls._identities.pop(id(identity), None)
                cls._depth -= 1
                if cls._depth == 0:
                    F.linear = cls._original  # kept: a reference to `linear` taken meanwhile still works


class CallWrapper:
    """The module's `forward` while a Scaler is attached: a plain object holding the scaler and the
    module, so `copy.deepcopy(model)` gives the copy its own (and `pickle` meets the Scaler's refusal)."""

    # nn.MultiheadAttention's data inputs (its masks are no values of the format: never rounded).
    _ATTENTION_INPUTS = ("query", "key", "value")

    def __init__(self, scaler, layer, module: nn.Module):
        self.scaler = scaler
        self.layer_id = layer.id
        self.module = module
        self.boundary = layer.boundary
        self.recurse = layer.recurse
        self.weight_name = layer.weight_name
        self.attention = layer.attention
        self.inner = module.__dict__.get("forward")  # an instance-level forward set before ours, if any
        # A torch.nn layer of its own (not a user's subclass or forward): it never writes to its inputs.
        self.reads_inputs_only = (self.boundary and not self.recurse and self.inner is None
                                  and type(module).__module__.startswith("torch.nn.modules."))
        # torch.nn's own Linear and ConvNd (not a subclass, no forward of the instance's, no parameter
        # added): their forward is one functional call on the input, the weight and the bias, which a
        # call with one positional input makes directly with the working copies (none swapped into the
        # module: the same call of the same function).
        self.direct = _DIRECT.get(type(module)) if self.reads_inputs_only and not self.attention else None
        self.direct_type = type(module)  # (a class changed since, e.g. by a parametrization, is called as it is)
        self.direct_slots = ((module, "weight"), (module, "bias"))
        self.calls: List[LayerCall] = []  # the calls open now (a module may call itself)
        self.pending = False  # the pre-hook opened a call that this forward has not yet entered

    @classmethod
    def install(cls, scaler, layer) -> "CallWrapper":
        wrapper = cls(scaler, layer, layer.module)
        layer.module.forward = wrapper
        # torch.jit.script asks each module for this before it compiles it: refused with a message
        # (the wrapper is no TorchScript).
        layer.module.__dict__["__prepare_scriptable__"] = wrapper.refuse_script
        return wrapper

    def refuse_script(self):
        raise RuntimeError("gradscale.torch: a model with a Scaler cannot be compiled by torch.jit.script (its "
                           "layers' forward is the Scaler's, which calls the core outside TorchScript); script "
                           "a copy after scaler.remove()")

    # ---- the hooks ---------------------------------------------------------------------------
    def pre_hook(self, module, inputs):
        refuse_compile()  # before the inputs' roundings, which a trace would record half of
        if self.pending and self.calls:
            self.calls.pop()  # the last call opened here never started (a later pre-hook raised)
        call = LayerCall(self.layer_id)
        self.calls.append(call)
        self.pending = True
        if self.attention:
            # Self-attention passes one tensor as query, key and value, and torch then projects it with
            # one packed GEMM: one Enter for it keeps `query is key is value`.
            call.entered = {}
            return tuple(self._enter_once(call, x) if i < 3 else x for i, x in enumerate(inputs))
        if len(inputs) == 1:
            return (self._enter(call, inputs[0]),)
        return tuple(self._enter(call, x) for x in inputs)

    def _enter_once(self, call: LayerCall, x):
        if not isinstance(x, torch.Tensor):
            return x
        if id(x) not in call.entered:
            call.entered[id(x)] = (x, self._enter(call, x))
        return call.entered[id(x)][1]

    def hook(self, module, inputs, output):
        call = self.calls.pop() if self.calls else LayerCall(self.layer_id)
        if self.attention and call.left:
            # The attention's own output left through its Exit inside the call (_attention), before
            # out_proj, a layer of its own whose Exit rounded what the module returns (here a view of it:
            # values of `format`, which the next layer need not round again).
            tracker = self.scaler._tracker
            return map_tensors(output, self.scaler._device, tracker.note_rounded)
        return self._leave(call, output)

    def _leave(self, call: LayerCall, output):
        """`output` (a tensor or a structure of them) through the call's Exit: rounded to `format`."""
        own, call.output = call.output, None
        if isinstance(output, torch.Tensor) and output.is_floating_point():  # (most layers: one tensor)
            t = checked_float32(output, self.scaler._device)
            return self._leave_one(call, t, t is own and self._own_output(t))
        return map_tensors(output, self.scaler._device, lambda t: self._leave_one(call, t, False))

    def _own_output(self, t: torch.Tensor) -> bool:
        """Whether `t`, the result of this call's direct function (torch's linear or convolution: a new
        tensor, not a view, which its own backward does not keep), is held by nothing that could see it
        change: no forward hook ran before this wrapper's (one of the module's own registered before the
        Scaler, or a global one). Its Exit then rounds it where it lies (one tensor fewer)."""
        hooks = self.module._forward_hooks
        return (not _global_forward_hooks and t._base is None and next(iter(hooks.values()), None) == self.hook
                and is_dense(t))

    def _leave_one(self, call: LayerCall, t: torch.Tensor, own: bool) -> torch.Tensor:
        tracker = self.scaler._tracker
        if t.requires_grad and torch.is_grad_enabled():
            return tracker.note_rounded(Exit.apply(t, tracker, call, False, own))
        return tracker.note_rounded(round_forward(t, tracker.format, tracker.core, tracker.pool))

    def _enter(self, call: LayerCall, x):
        """One argument of a layer call: a floating tensor gets its `Enter` (rounded to `format`)."""
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return x
        t = checked_float32(x, self.scaler._device)
        tracker = self.scaler._tracker
        # An earlier layer's rounded output, untouched, is read as it is by a layer that does not write
        # to its inputs (torch.nn's own): rounding it again would copy the same values.
        rounded = self.reads_inputs_only and tracker.is_rounded(t)
        if t.requires_grad and torch.is_grad_enabled():
            return Enter.apply(t, tracker, call, rounded)
        return t if rounded else round_forward(t, tracker.format, tracker.core, tracker.pool)

    # ---- the call ----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if not self.pending:  # a boundary call's pre-hook has checked already
            refuse_compile()
        call = None
        if self.boundary and self.pending and self.calls:
            call = self.calls[-1]
            if kwargs:
                if self.attention:
                    kwargs = {k: self._enter_once(call, v) if k in self._ATTENTION_INPUTS else v
                              for k, v in kwargs.items()}
                else:
                    kwargs = {k: self._enter(call, v) for k, v in kwargs.items()}
            if self.attention:
                call.entered = None  # the inputs' identities are not needed after the call's start
        self.pending = False
        params = self.module._parameters
        direct = (self.direct is not None and len(args) == 1 and not kwargs and len(params) == 2
                  and "weight" in params and "bias" in params and type(self.module) is self.direct_type)
        swapped: List[Tuple[nn.Module, str, nn.Parameter]] = []
        try:
            if direct:  # the copies as arguments: nothing swapped in
                used = [u for _, _, _, u in self._working_weights(call, self.direct_slots)]
            else:
                swapped = self._use_working_weights(call)
            # Under torch.autocast the layer still computes in float32 on values of `format` (SPEC
            # §4-§5: its backward product must reach the core in fp32, to be multiplied by s before its
            # one rounding); what runs outside the layers keeps autocast's dtype.
            with autocast_off(self.scaler._device_type):
                if direct:
                    result = self.direct(self.module, args[0], *used)
                    if call is not None:
                        call.output = result  # its Exit may round it in place (_own_output)
                    return result
                if self.attention:
                    return self._attention(args, kwargs, call)
                if self.inner is not None:
                    return self.inner(*args, **kwargs)
                return type(self.module).forward(self.module, *args, **kwargs)
        except BaseException:
            if call is not None and self.calls and self.calls[-1] is call:
                self.calls.pop()  # no forward hook will close it
            raise
        finally:
            for module, name, master in reversed(swapped):
                _set_param(module, name, master)

    def _attention(self, args, kwargs, call: Optional[LayerCall]):
        """nn.MultiheadAttention's own forward with an identity for its output projection (so it
        returns the attention's output, exactly: `_IdentityProjection` passes it on without a product),
        which leaves the layer there, through its Exit (the attention layer's output is out_proj's input:
        the gradient its in-projection and controller see is the one out_proj sends it, at that scale);
        then `out_proj` called as a module: a layer boundary of its own, its gradient at out_proj's own
        local scale."""
        out_proj = self.module.out_proj
        saved = (out_proj._parameters["weight"], out_proj._parameters.get("bias"))
        eye = torch.eye(out_proj.in_features, dtype=saved[0].dtype, device=saved[0].device)
        _set_param(out_proj, "weight", eye)
        _set_param(out_proj, "bias", torch.zeros_like(eye[0]))  # zeros, not None: the fused paths take a tensor
        try:
            forward = self.inner if self.inner is not None else \
                (lambda *a, **k: type(self.module).forward(self.module, *a, **k))
            with _IdentityProjection.installed(eye):
                result = forward(*args, **kwargs)
        finally:
            _set_param(out_proj, "weight", saved[0])
            _set_param(out_proj, "bias", saved[1])
        if call is not None:
            result = self._leave(call, result)
            call.left = True
        if isinstance(result, tuple):
            return (self._project(result[0]),) + tuple(result[1:])
        return self._project(result)

    def _project(self, out: torch.Tensor) -> torch.Tensor:
        """out_proj on the attention's output as torch's own forward applies it: to the (L·N, E) matrix
        of the sequence-first layout (so its sums are PyTorch's, bit for bit), shaped back after."""
        if out.dim() != 3:
            return self.module.out_proj(out)
        batch_first = getattr(self.module, "batch_first", False)
        lne = out.transpose(0, 1) if batch_first else out
        y = self.module.out_proj(lne.reshape(-1, lne.shape[-1])).view(lne.shape[:-1] + (-1,))
        return y.transpose(0, 1) if batch_first else y

    def _working_weights(self, call: Optional[LayerCall], slots) -> List[list]:
        """What this call computes with in each parameter slot of `slots` ((module, name) pairs): one
        (module, name, held, used) per slot — `used` is the working copy of a Parameter `held` there (the
        parameters that require grad, under grad mode, get theirs from one WorkingWeights node), else
        `held` itself (None, or an enclosing layer's working copy). Notes the call's weight."""
        tracker = self.scaler._tracker
        grad = torch.is_grad_enabled()
        found: List[list] = []  # [module, name, held, used]
        made: List[list] = []  # the entries whose copy the WorkingWeights node makes
        for module, name in slots:
            p = module._parameters[name]
            if not isinstance(p, nn.Parameter):
                found.append([module, name, p, p])  # None, or already a working copy (an enclosing layer's call)
                continue
            if p.dtype != torch.float32:
                raise TypeError(
                    f"gradscale.torch: parameter '{name}' of layer '{tracker.layers[self.layer_id].name}' is "
                    f"{p.dtype}; the Scaler keeps float32 masters and emulates format= in them "
                    "(model.half()/.double()/.to(dtype) after Scaler(model): make a new model and Scaler, "
                    "or call scaler.remove() first)")
            if not tracker.substitute:
                found.append([module, name, p, p])
            elif grad and p.requires_grad:
                found.append([module, name, p, None])
                made.append(found[-1])
            else:
                found.append([module, name, p, tracker.working_copy(p, tracker.buffers(p))])
        if made:
            for entry, copy in zip(made, WorkingWeights.apply(tracker, self.layer_id, *(e[2] for e in made))):
                entry[3] = copy
        if call is not None:
            for module, name, _, used in found:
                if module is self.module and name == self.weight_name:
                    call.weight = used
        return found

    def _use_working_weights(self, call: Optional[LayerCall]) -> List[Tuple[nn.Module, str, nn.Parameter]]:
        """Puts this call's working copy in place of each parameter; returns what to put back."""
        modules = self.module.modules() if self.recurse else (self.module,)
        slots = [(module, name) for module in modules for name in list(module._parameters)]
        found = self._working_weights(call, slots)
        swapped: List[Tuple[nn.Module, str, nn.Parameter]] = []  # nothing is swapped before all copies exist
        try:
            for module, name, held, used in found:
                if used is not held:
                    _set_param(module, name, used)
                    swapped.append((module, name, held))
        except BaseException:
            for module, name, master in reversed(swapped):
                _set_param(module, name, master)
            raise
        return swapped

    def remove(self) -> None:
        """Puts the module's own forward back (as a hook handle's remove() does)."""
        if self.module.__dict__.get("__prepare_scriptable__") == self.refuse_script:
            del self.module.__dict__["__prepare_scriptable__"]
        if self.module.__dict__.get("forward") is self:
            if self.inner is None:
                del self.module.forward
            else:
                self.module.forward = self.inner


def attached(module: nn.Module) -> Optional[Any]:
    """The Scaler attached to `module` (its forward is a CallWrapper), or None."""
    wrapper = module.__dict__.get("forward")
    return wrapper.scaler if isinstance(wrapper, CallWrapper) else None

