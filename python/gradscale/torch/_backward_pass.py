"""Backward passes of a PyTorch model under gradscale: where scales live on the autograd graph.

A gradient's scale changes in four places only: at the model's outputs (S0, `LossEdge`), at a
layer's input (×s, `Enter`), at a layer call's working weight (÷S: the weight-gradient part, made
true) and where several gradients meet (the join target T of SPEC §5). Every other node passes on the
scale its incoming gradient had. So `scaler.scale(loss)` walks the graph of `loss` once and makes a
`BackwardPass` of it:

- a node fed by several distinct consumers inside the model is a **join**: each consumer's post-hook
  takes its part (g_i, S_i) out of the sum autograd would make (leaving a zero), and the node's
  pre-hook brings the parts to one scale T before adding them, then rounds the sum once — so no sum
  ever mixes scales (a residual shortcut, a tensor read twice, a module called twice, an in-place op).
  A node inside one layer call (all its consumers lead to that call's Exit before any other boundary:
  attention's split of its packed projection) is no join: its parts are fp32 at the layer's scale,
  and autograd's sum is the layer's own arithmetic;
- an edge into a leaf from anything but a `WorkingWeights` (a parameter used outside its layer's call,
  an input that requires grad) carries a part at its consumer's scale: the post-hook rounds it and
  divides it by that scale, so every leaf receives true gradients.

The scale a node receives is found by following its consumers towards the loss to the nearest node
that set one (`_sent` for Enter and LossEdge, `_into` for joins), and memoised for the pass. Scales are
handles of the core's table for the step (`ExternalBackward.scale_handle`): on a GPU the local scales
and join targets stay on the device, and the pass reads a value only where it computes with one (a
graph built by create_graph, a reentrant checkpoint's inputs, the shadow's comparison).

Each pass owns its hooks and maps; a hook of another pass (a graph kept with retain_graph) does
nothing. A pass is *ready* after the walk, *running* from its first LossEdge backward, *done* when
autograd has finished (a callback) — or *failed*, when the next public call of the Scaler finds it
still running (backward raised: autograd runs no callback then). A reentrant checkpoint's nested
backward is a pass of its own, walked when it starts, whose roots receive the checkpoint node's scale.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Tuple

import torch

from ._functions import (Enter, Exit, LossEdge, WorkingWeights, differentiable, is_dense, owned_copy,
                         rounding_target)
from ._join import join_parts

if TYPE_CHECKING:
    from ._tracker import Tracker

_ENTER = Enter._backward_cls
_EXIT = Exit._backward_cls
_LOSS = LossEdge._backward_cls
_WEIGHT = WorkingWeights._backward_cls
_CHECKPOINT = "CheckpointFunctionBackward"  # torch.utils.checkpoint's reentrant Function


def _downstream(node, edges, through) -> Iterator[object]:
    """The nodes downstream of `node` (its consumers, theirs, ... towards the loss; `edges`: each
    producer's uses), each once, depth first; the walk goes on past a node where through(node) is true."""
    stack = [consumer for consumer, _, _ in edges.get(node, ())]
    seen = set()
    while stack:
        cur = stack.pop()
        if cur in seen:
            continue
        seen.add(cur)
        yield cur
        if through(cur):
            stack.extend(consumer for consumer, _, _ in edges.get(cur, ()))


def _accumulate_grad_type() -> type:
    """The type of autograd's leaf nodes (AccumulateGrad), from a graph of one product."""
    leaf = torch.zeros((), requires_grad=True)
    return type((leaf * 1).grad_fn.next_functions[0][0])


_LEAF = _accumulate_grad_type()


def _not_enter_or_loss(node) -> bool:
    return type(node) is not _ENTER and type(node) is not _LOSS


# What the walk sorts nodes by, per node type (a dict lookup per node instead of comparisons and a
# name): 0 for most, else one of the kinds below.
_IS_ENTER, _IS_EXIT, _IS_LOSS, _IS_CHECKPOINT = 1, 2, 3, 4
_CATEGORY: Dict[type, int] = {}


def _category(kind: type) -> int:
    value = (_IS_ENTER if kind is _ENTER else _IS_EXIT if kind is _EXIT else _IS_LOSS if kind is _LOSS
             else _IS_CHECKPOINT if kind.__name__ == _CHECKPOINT else 0)
    _CATEGORY[kind] = value
    return value


# One wrapper of torch.autograd.backward for the process: a reentrant checkpoint's backward calls it for
# its nested pass, which is walked here before it runs. Outside such a checkpoint it only forwards.
_trackers_in_checkpoint: "threading.local" = threading.local()
_torch_backward = torch.autograd.backward

# How many torch.autograd.backward calls this thread is inside: only their weight gradients go into
# `.grad` (AccumulateGrad, which copies out of a kept buffer, `_held`), so only they write into a
# parameter's kept weight-gradient buffers. torch.autograd.grad hands its results to the caller, who
# may keep a `.detach()` of them after the result itself is gone: those get tensors of their own. (The
# buffers are kept on the CPU only, where autograd runs its hooks on the calling thread.)
_into_grad: "threading.local" = threading.local()


def _accumulating() -> bool:
    return getattr(_into_grad, "depth", 0) > 0


def _backward(tensors, grad_tensors=None, *args, **kwargs):
    _into_grad.depth = getattr(_into_grad, "depth", 0) + 1
    try:
        return _nested_or_plain_backward(tensors, grad_tensors, *args, **kwargs)
    finally:
        _into_grad.depth -= 1


def _nested_or_plain_backward(tensors, grad_tensors=None, *args, **kwargs):
    entry = getattr(_trackers_in_checkpoint, "entry", None)
    if entry is None or entry["started"]:
        return _torch_backward(tensors, grad_tensors, *args, **kwargs)
    entry["started"] = True
    outer: BackwardPass = entry["pass"]
    tracker = outer.tracker
    roots = [t.grad_fn for t in ([tensors] if isinstance(tensors, torch.Tensor) else tensors)
             if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    nested = BackwardPass(tracker, roots, root_scale=entry["scale"], nested=True)
    nested.state = "running"
    tracker.current = nested
    try:
        return _torch_backward(tensors, grad_tensors, *args, **kwargs)
    finally:
        entry["inputs"] = nested.input_scales()
        nested.close("done")
        tracker.current = outer


def _install_backward_wrapper() -> None:
    if torch.autograd.backward is not _backward:
        torch.autograd.backward = _backward


class BackwardPass:
    """One backward pass: the walk of its graph, its hooks and its scales."""

    def __init__(self, tracker: Tracker, roots: List[object], root_scale: Optional[int] = None, nested: bool = False):
        self.tracker = tracker
        self.core = tracker.core
        self.state = "ready"
        self.root_scale = root_scale  # a handle; None: 1, held when backward first needs it
        self.nested = nested
        self.reason: Optional[str] = None
        self._first_consumer: Dict[object, object] = {}  # node -> the first of its consumers the walk met
        self._into: Dict[object, int] = {}  # scale handles
        self._sent: Dict[object, int] = {}
        self._parts: Dict[int, List[Tuple[int, torch.Tensor, int]]] = {}
        self._received: Dict[object, torch.Tensor] = {}
        self._checkpoint_inputs: Dict[int, dict] = {}
        # The hooks hold tokens, never nodes: a node holding a hook that holds the node is a cycle
        # through C++ that Python's collector cannot see. The pass holds its nodes until it closes.
        self._nodes: Dict[int, object] = {}
        # Weight gradients in a parameter's kept buffers (`_tracker.Buffers`), held until the pass ends
        # so that PyTorch's gradient accumulation adds or copies them into `.grad` and never makes the
        # buffer itself `.grad` (a `.grad.detach()` the user keeps would see the next step's values).
        self._held: List[torch.Tensor] = []
        self._loss_edges: set = set()
        self._input_leaves: List[object] = []  # nested: the leaves that are no parameter (its inputs)
        self._roots = list(roots)
        self.layer_edges: Dict[int, set] = {}
        self.param_layers: set = set()  # the layers whose parameters this pass's graph reaches (leaves)
        self.unowned: List[torch.Tensor] = []  # leaves of no layer (outside the model, or a module added since)
        self.model_nodes = self._walk(roots)

    # ---- state -------------------------------------------------------------------------------
    def root_is(self, root) -> bool:
        return len(self._roots) == 1 and self._roots[0] is root

    def walked(self, node) -> bool:
        return id(node) in self._loss_edges and self._nodes.get(id(node)) is node

    def start(self) -> None:
        self.state = "running"
        torch.autograd.Variable._execution_engine.queue_callback(self._finished)
        if self.tracker.on_start is not None:
            self.tracker.on_start(self)

    def _finished(self) -> None:
        if self.state != "running" or self.tracker.current is not self:
            return
        self.close("done")
        if self.tracker.on_done is not None:
            self.tracker.on_done(self)

    def close(self, state: str) -> None:
        """Ends the pass: its hooks do nothing from now on, and it lets go of the graph."""
        self.state = state
        self._first_consumer.clear()
        self._into.clear()
        self._sent.clear()
        self._parts.clear()
        self._received.clear()
        self._checkpoint_inputs.clear()
        self._held.clear()
        self._nodes.clear()
        self._roots = []
        self._input_leaves = []

    def _active(self) -> bool:
        return self.state == "running" and self.tracker.current is self

    # ---- the walk ----------------------------------------------------------------------------
    def _walk(self, roots: List[object]) -> int:
        """Walks the graph from `roots` and installs the join and leaf hooks. Returns the number of
        model nodes seen (0: the loss does not depend on the model's outputs)."""
        # One pass over the graph: each node's producers (its next_functions, read once: each read
        # builds new tuples) and each producer's uses (consumer, the consumer's input slot k, the
        # producer's output slot j).
        # The nodes the later steps look at are sorted out on the way (by type: Function nodes are
        # exactly their Functions' backward classes): the LossEdges, the Exits, every layer boundary as
        # (layer, 0 for Enter / 1 for Exit), and the reentrant checkpoints.
        edges: Dict[object, List[Tuple[object, int, int]]] = {}
        producers_of: Dict[object, tuple] = {}  # node -> its next_functions
        losses: List[object] = []
        exits: List[object] = []
        boundaries: List[Tuple[int, int]] = []
        checkpoints: List[object] = []
        seen = set(roots)
        stack = list(roots)
        category = _CATEGORY.get
        while stack:
            node = stack.pop()
            kind = category(type(node))
            if kind is None:
                kind = _category(type(node))
            if kind:
                if kind == _IS_ENTER:
                    boundaries.append((node.layer_id, 0))
                elif kind == _IS_EXIT:
                    boundaries.append((node.layer_id, 1))
                    exits.append(node)
                elif kind == _IS_LOSS:
                    losses.append(node)
                else:
                    checkpoints.append(node)
            found = node.next_functions  # each read builds new tuples: read once
            producers_of[node] = found
            k = -1
            for producer, j in found:
                k += 1
                if producer is None:
                    continue
                uses = edges.get(producer)
                if uses is None:
                    edges[producer] = [(node, k, j)]
                    if producer not in seen:
                        seen.add(producer)
                        stack.append(producer)
                else:
                    uses.append((node, k, j))
        if self.nested:  # a checkpointed segment: all of it is inside the model
            in_model = seen
        else:  # everything upstream of a LossEdge (the loss's own graph stays in fp32 at 1)
            in_model = set()
            stack = list(losses)
            for n in stack:
                self._loss_edges.add(self._token(n))
            while stack:
                for producer, _ in producers_of[stack.pop()]:
                    if producer is not None and producer not in in_model:
                        in_model.add(producer)
                        stack.append(producer)
        params = self._layer_params()
        leaf_slots: Dict[object, List[Tuple[int, int]]] = {}
        join_slots: Dict[object, List[Tuple[int, int, int]]] = {}
        first_consumer = self._first_consumer
        for producer, uses in edges.items():
            first = uses[0][0]
            first_consumer[producer] = first
            # Used by several distinct consumers (a node using it twice is one consumer).
            several = len(uses) > 1 and any(c is not first for c, _, _ in uses)
            if type(producer) is _LEAF:
                inside = [(c, k, j) for c, k, j in uses if c in in_model or isinstance(c, _LOSS)]
                variable = producer.variable
                layer = params.get(id(variable))
                if layer is not None:
                    self.param_layers.add(layer)
                elif not self.nested and isinstance(variable, torch.nn.Parameter):
                    self.unowned.append(variable)
                if self.nested and layer is None:
                    # An input of the checkpointed segment: its gradient leaves at its scale (the
                    # checkpoint node brings the inputs to one), parts joined like any join.
                    self._input_leaves.append(producer)
                    self._token(producer)
                    if several:
                        self._add_join(producer, inside, join_slots)
                    continue
                for consumer, k, _ in inside:
                    if type(consumer) is not _WEIGHT:  # WorkingWeights unscales its own parts
                        leaf_slots.setdefault(consumer, []).append((k, -1 if layer is None else layer))
            elif several and producer in in_model and not self._inside_one_call(producer, edges):
                self._add_join(producer, uses, join_slots)
        for consumer in set(leaf_slots) | set(join_slots):
            consumer.register_hook(self._post_hook(self._token(consumer), leaf_slots.get(consumer, []),
                                                   join_slots.get(consumer, [])))
        for node in checkpoints:  # after the consumers' hooks: a checkpoint's own post-hook runs last
            if node not in in_model:
                continue
            token = self._token(node)
            node.register_prehook(self._checkpoint_pre_hook(token))
            node.register_hook(self._checkpoint_post_hook(token))
        self._learn_layer_graph(exits, edges)
        # What ranks reducing statistics inside backward must share: the layer boundaries and joins the
        # pass meets, in no particular order.
        self.signature = sorted(boundaries)
        self.signature.append((-1, len(join_slots)))
        for root in roots:
            self._token(root)  # keeps the ids from being reused while the pass lasts
            if not self.nested:
                root.register_prehook(self._root_hook)
        return len(in_model)

    def _root_hook(self, grad_outputs):
        """Backward has reached the loss: the pass runs (and fails, if it raises from here on)."""
        shadow = self.tracker.shadow
        if self.state == "ready" and self.tracker.current is self and not (shadow is not None and shadow.recording):
            self.start()
        return None

    @staticmethod
    def _inside_one_call(node, edges) -> bool:
        """Whether every path from `node` towards the loss meets the Exit of one and the same layer call
        before any other boundary: `node` is then an operation of that layer's own forward (attention
        splitting its packed projection into query, key and value; a residual add inside a module chosen
        by name), whose gradients are fp32 at the layer's one scale. Autograd's own sum is then the layer's
        arithmetic, as everything inside a layer is: no join, which would round the sum to the gradient
        format before the layer's one rounding at its input."""
        call = None
        for cur in _downstream(node, edges, lambda n: type(n) is not _EXIT):
            if type(cur) is _EXIT:
                if call is None:
                    call = cur.call
                elif cur.call is not call:
                    return False
            elif type(cur) is _ENTER or type(cur) is _LOSS or type(cur).__name__ == _CHECKPOINT or not edges.get(cur):
                return False  # another layer's input, the loss, or a root: outside every layer call
        return call is not None

    def _add_join(self, producer, uses, join_slots) -> None:
        token = self._token(producer)
        for consumer, k, j in uses:
            join_slots.setdefault(consumer, []).append((k, token, j))
        layer = producer.layer_id if isinstance(producer, (_ENTER, _EXIT)) else -1
        producer.register_prehook(self._join_hook(token, layer))

    def _layer_params(self) -> Dict[int, int]:
        """id(parameter) -> the layer that owns it, read from the modules now (never kept across
        passes: functional_call and load_state_dict(assign=True) replace Parameter objects)."""
        owner: Dict[int, int] = {}
        for layer in self.tracker.layers:
            for p in layer.current_params():
                if id(p) not in owner:
                    owner[id(p)] = layer.id
        return owner

    def _learn_layer_graph(self, exits, edges) -> None:
        """From each layer's output (an Exit node), towards the loss through every node that is no
        layer boundary, to the layers whose inputs (Enter nodes) it reaches — those read it, and in
        backward send it the scale it receives (SPEC §6.5 charges an overflow of that gradient to
        them). A layer's internals reached without an Enter are walked through to its own readers."""
        for node in exits:
            for cur in _downstream(node, edges, _not_enter_or_loss):
                if type(cur) is _ENTER:
                    self.layer_edges.setdefault(cur.layer_id, set()).add(node.layer_id)
        self.tracker.learn(self)

    def _token(self, node) -> int:
        token = id(node)
        self._nodes[token] = node
        return token

    # ---- scales ------------------------------------------------------------------------------
    def into(self, node) -> int:
        """The scale (a handle) of the gradient `node` receives (its consumers have all run)."""
        path = []
        cur = node
        while True:
            if cur in self._into:
                value = self._into[cur]
                break
            nxt = self._first_consumer.get(cur)
            if nxt is None:  # a root: the loss at scale 1, a checkpoint's output at its node's scale
                if self.root_scale is None:
                    self.root_scale = self.core.scale_handle(1.0)
                value = self.root_scale
                break
            path.append(cur)
            if nxt in self._sent:
                value = self._sent[nxt]
                break
            cur = nxt
        for n in path:
            self._into[n] = value
        return value

    def sent(self, node) -> int:
        return self._sent[node] if node in self._sent else self.into(node)

    def input_scales(self) -> Dict[int, Tuple[torch.Tensor, int]]:
        """Nested: id(input leaf's variable) -> (variable, scale handle of the gradient it was given)."""
        return {id(leaf.variable): (leaf.variable, self.into(leaf)) for leaf in self._input_leaves}

    # ---- hooks ---------------------------------------------------------------------------------
    def _post_hook(self, consumer: int, leaf_slots, join_slots):
        def hook(grad_inputs, grad_outputs):
            if not self._active():
                return None
            grads = list(grad_inputs)
            scale = self.sent(self._nodes[consumer])
            for k, producer, j in join_slots:
                g = grads[k]
                if g is None:
                    continue
                self._parts.setdefault(producer, []).append((j, g, scale))
                grads[k] = torch.zeros((), dtype=g.dtype, device=g.device).expand_as(g)
            for k, layer in leaf_slots:
                g = grads[k]
                if g is not None:
                    grads[k] = self._true_gradient(layer, g, scale)
            return tuple(grads)
        return hook

    def _join_hook(self, producer: int, layer: int):
        def hook(grad_outputs):
            if not self._active():
                return None
            parts = self._parts.pop(producer, None)
            if not parts:
                return None
            grads, target = join_parts(self.core, layer, parts, grad_outputs)
            if len({s for _, _, s in parts}) > 1:
                self.tracker.note_join([s for _, _, s in parts])
            self._into[self._nodes[producer]] = target
            return tuple(grads)
        return hook

    def _checkpoint_pre_hook(self, token: int):
        def hook(grad_outputs):
            if self._active():
                node = self._nodes[token]
                entry = {"pass": self, "scale": self.into(node), "started": False, "inputs": {},
                         "outer": getattr(_trackers_in_checkpoint, "entry", None)}
                self._checkpoint_inputs[token] = entry
                _trackers_in_checkpoint.entry = entry
            return None
        return hook

    def _checkpoint_post_hook(self, token: int):
        def hook(grad_inputs, grad_outputs):
            entry = self._checkpoint_inputs.pop(token, None)
            if entry is None:
                return None
            _trackers_in_checkpoint.entry = entry["outer"]
            if not self._active():
                return None
            # Each input's gradient at the scale the nested pass left it at; one scale for all of them
            # (the smallest: a power-of-two division, then one rounding of what it moved). Their values
            # are read here (on a GPU, one wait per reentrant checkpoint).
            scales = {id(var.grad): s for var, s in entry["inputs"].values() if var.grad is not None}
            found = [(k, g, scales.get(id(g), entry["scale"])) for k, g in enumerate(grad_inputs) if g is not None]
            if not found:
                self._sent[self._nodes[token]] = entry["scale"]
                return None
            value = {h: self.core.scale_value(h) for _, _, h in found}
            target = min((h for _, _, h in found), key=lambda h: value[h])
            grads = list(grad_inputs)
            for k, g, h in found:
                if value[h] != value[target]:
                    factor = value[target] / value[h]
                    out = owned_copy(g * factor)
                    self.core.round_join(-1, out.data_ptr(), out.numel())
                    grads[k] = differentiable(g, out, factor)
            self._sent[self._nodes[token]] = target
            return tuple(grads)
        return hook

    # ---- what the Functions call ---------------------------------------------------------------
    def _true_gradient(self, layer: int, g: torch.Tensor, scale: int, buffers=None) -> torch.Tensor:
        """A gradient part at `scale` (a handle) rounded (SPEC §4) and divided by it: the true gradient
        (in one of `buffers`, the parameter's kept weight-gradient buffers, when given)."""
        if g.is_sparse:
            g = g.coalesce()
            values = owned_copy(g.values())
            if values.numel():
                self.core.weight_gradient(layer, values.data_ptr(), values.numel(), scale)
            return torch.sparse_coo_tensor(g.indices(), values, g.shape, device=g.device)
        out, source = rounding_target(g, buffers, self.tracker.pool)
        n = out.numel()
        if n:
            self.core.weight_gradient(layer, out.data_ptr(), n, scale, source)
        return differentiable(g, out, lambda: 1.0 / self.core.scale_value(scale))

    def loss_backward(self, ctx, g: torch.Tensor) -> torch.Tensor:
        out, source = rounding_target(g, pool=self.tracker.pool)
        s0 = self.core.loss_gradient(out.data_ptr(), out.numel(), source=source)  # a handle
        self._sent[ctx] = s0
        return differentiable(g, out, lambda: self.core.scale_value(s0))

    def exit_backward(self, ctx, g: torch.Tensor) -> torch.Tensor:
        out, source = rounding_target(g, pool=self.tracker.pool)
        self.core.note_layer(ctx.layer_id, self.into(ctx))
        n = out.numel()
        if n:
            self.core.round_received(ctx.layer_id, out.data_ptr(), n, source)
        self._received[ctx.call] = out
        return differentiable(g, out, 1.0)

    def enter_backward(self, ctx, g: torch.Tensor) -> torch.Tensor:
        scale_in = self.into(ctx)
        out, source = rounding_target(g, pool=self.tracker.pool)
        if not out.numel():  # an empty batch: nothing to scale
            self._sent[ctx] = scale_in
            return differentiable(g, out, 1.0)
        layer = self.tracker.layers[ctx.layer_id]
        received: Optional[torch.Tensor] = self._received.get(ctx.call)
        weight = ctx.call.weight if layer.parametric else None
        if weight is not None and not is_dense(weight):
            weight = weight.detach().contiguous()
        # (Sizes as torch.Size: the core takes any sequence.)
        sent = self.core.upstream(ctx.layer_id, out.data_ptr(), out.shape,
                                  received.data_ptr() if received is not None else 0,
                                  received.shape if received is not None else (),
                                  weight.data_ptr() if weight is not None else 0,
                                  weight.shape if weight is not None else (), scale_in, source)
        self._sent[ctx] = sent  # s·S_in
        if self.tracker.shadow is not None:
            self.tracker.shadow.compare_upstream(ctx.layer_id, ctx.call, g, out, self.core.scale_value(sent))
        return differentiable(g, out, lambda: self.core.local_value(sent))

    def weight_part(self, ctx, i: int, g: torch.Tensor) -> torch.Tensor:
        """The weight-gradient part `g` of a WorkingWeights node's i-th copy, made true."""
        buffers = ctx.buffers[i] if _accumulating() else None
        out = self._true_gradient(ctx.layer_id, g, self.into(ctx), buffers[1] if buffers is not None else None)
        if buffers is not None:
            self._held.append(out)
        if self.tracker.shadow is not None:
            self.tracker.shadow.compare_weight(ctx.layer_id, (ctx, i), g, out)
        return out
