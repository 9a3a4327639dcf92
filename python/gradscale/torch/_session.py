"""One backward pass of a PyTorch model under gradscale: where scales live on the autograd graph.

A gradient's scale changes in three places only: at the model's outputs (S0, `LossEdge`), at a
layer's input (×s, `Enter`) and where several gradients meet (the join target T of SPEC §5). Every
other node passes on the scale its incoming gradient had. So after the forward pass, `instrument`
walks the graph once, from the loss:

- a node fed by several distinct consumers inside the model is a **join**: each consumer's post-hook
  takes its part (g_i, S_i) out of the sum autograd would make (leaving a zero), and the node's
  pre-hook brings the parts to one scale T before adding them, then rounds the sum once — so no sum
  ever mixes scales (a residual shortcut, a tensor read twice, a module called twice, an in-place op);
- an edge into a leaf (a parameter) carries a **weight-gradient part** at its consumer's scale: the
  post-hook rounds it and divides it by that scale (SPEC §4), so `.grad` accumulates true gradients
  even when a tied weight or a module called twice sends parts at different scales.

The scale a node receives is found by following its consumers towards the loss to the nearest node
that set one (`_sent` for Enter and LossEdge, `_into` for joins), and memoised for the pass.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch

from ._functions import Enter, Exit, LossEdge, _owned_copy
from ._layers import Layer, param_owner

_ENTER = Enter._backward_cls
_EXIT = Exit._backward_cls
_LOSS = LossEdge._backward_cls


def _is_leaf_node(node) -> bool:
    return type(node).__name__ == "AccumulateGrad"


class Session:
    """The plug-in's per-pass state around the core's ExternalBackward."""

    def __init__(self, core, layers: List[Layer], fmt: str):
        self.core = core
        self.layers = layers
        self.format = fmt
        self.owner = param_owner(layers)
        self.active = False  # a step is open: scale(loss) was called and step()/update() not yet
        self.joins = 0  # joins whose parts arrived at different scales, since the Scaler was made
        # The layer graph (LayerInfo::inputs: which layers' outputs each layer reads; the model's input
        # is not listed), gathered from every pass so far; `graph_grew` until the core was given it.
        self.layer_inputs: List[set] = [set() for _ in layers]
        self.graph_grew = False
        self._reset_graph()

    # ---- the graph ----------------------------------------------------------------------------
    def _reset_graph(self) -> None:
        self._consumers: Dict[object, List[object]] = {}
        self._into: Dict[object, float] = {}
        self._sent: Dict[object, float] = {}
        self._parts: Dict[object, List[Tuple[int, torch.Tensor, float]]] = {}
        self._received: Dict[Tuple[int, int], torch.Tensor] = {}
        # The hooks hold tokens, never nodes: a node holding a hook that holds the node is a cycle
        # through C++ that Python's collector cannot see, and it would keep every step's graph alive.
        self._nodes: Dict[int, object] = {}
        self._instrumented: Dict[int, int] = {}  # id(root) -> model nodes, for roots of this pass
        self._callback_queued = False

    def instrument(self, roots: List[object]) -> int:
        """Walks the graph from `roots` and installs the join and weight-gradient hooks. Returns the
        number of model nodes seen (0: the loss does not depend on the model's outputs)."""
        if not self._callback_queued and not self._instrumented:
            self._reset_graph()  # what a pass that never ran backward left behind
        key = id(roots[0])
        if len(roots) == 1 and key in self._instrumented:
            return self._instrumented[key]  # scale() twice on one loss: its hooks are in place already
        edges: Dict[object, List[Tuple[object, int, int]]] = {}
        seen = set(roots)
        stack = list(roots)
        while stack:
            node = stack.pop()
            for k, (producer, j) in enumerate(node.next_functions):
                if producer is None:
                    continue
                edges.setdefault(producer, []).append((node, k, j))
                if producer not in seen:
                    seen.add(producer)
                    stack.append(producer)
        # Inside the model: everything upstream of a LossEdge (the loss's own graph stays in fp32 at 1).
        in_model = set()
        stack = [n for n in seen if isinstance(n, _LOSS)]
        while stack:
            node = stack.pop()
            for producer, _ in node.next_functions:
                if producer is not None and producer not in in_model:
                    in_model.add(producer)
                    stack.append(producer)
        leaf_slots: Dict[object, List[Tuple[int, int]]] = {}
        join_slots: Dict[object, List[Tuple[int, int, int]]] = {}
        for producer, uses in edges.items():
            distinct: List[object] = []
            for consumer, _, _ in uses:
                if not any(consumer is d for d in distinct):
                    distinct.append(consumer)
            self._consumers[producer] = distinct
            if _is_leaf_node(producer):
                layer = self.owner.get(id(producer.variable), -1)
                for consumer, k, _ in uses:
                    if consumer in in_model or isinstance(consumer, _LOSS):
                        leaf_slots.setdefault(consumer, []).append((k, layer))
            elif producer in in_model and len(distinct) >= 2:
                token = self._token(producer)
                for consumer, k, j in uses:
                    join_slots.setdefault(consumer, []).append((k, token, j))
                producer.register_prehook(self._join_hook(token, self._layer_of(producer)))
        for consumer in set(leaf_slots) | set(join_slots):
            consumer.register_hook(self._post_hook(self._token(consumer), leaf_slots.get(consumer, []),
                                                   join_slots.get(consumer, [])))
        self._learn_layer_graph(seen, edges)
        self._nodes[key] = roots[0]  # keeps the id from being reused while the pass lasts
        self._instrumented[key] = len(in_model)
        return len(in_model)

    def _learn_layer_graph(self, nodes, edges) -> None:
        """Adds this pass's layer graph to `layer_inputs`: from each layer's output (an Exit node),
        towards the loss through every node that is no layer boundary, to the layers whose inputs
        (Enter nodes) it reaches — those read it, and in backward send it the scale it receives
        (SPEC §6.5 charges an overflow of that gradient to them). A layer's internals reached without
        an Enter (a tensor it captured) are walked through to its own readers, whose scale they carry."""
        for node in nodes:
            if not isinstance(node, _EXIT):
                continue
            source = node.layer_id
            stack = [consumer for consumer, _, _ in edges.get(node, ())]
            visited = set()
            while stack:
                cur = stack.pop()
                if cur in visited:
                    continue
                visited.add(cur)
                if isinstance(cur, _ENTER):
                    if source not in self.layer_inputs[cur.layer_id]:
                        self.layer_inputs[cur.layer_id].add(source)
                        self.graph_grew = True
                elif not isinstance(cur, _LOSS):
                    stack.extend(consumer for consumer, _, _ in edges.get(cur, ()))

    def take_layer_graph(self) -> Optional[List[List[int]]]:
        """The layer graph, when it grew since it was last taken (else None)."""
        if not self.graph_grew:
            return None
        self.graph_grew = False
        return [sorted(ids) for ids in self.layer_inputs]

    def instrumented(self, root) -> bool:
        """Whether `root`'s graph already has this pass's hooks (scale() called twice on one loss)."""
        return id(root) in self._instrumented and self._nodes.get(id(root)) is root

    def _token(self, node) -> int:
        token = id(node)
        self._nodes[token] = node
        return token

    def into(self, node) -> float:
        """The scale of the gradient `node` receives (its consumers have all run)."""
        path = []
        cur = node
        while True:
            if cur in self._into:
                value = self._into[cur]
                break
            consumers = self._consumers.get(cur)
            if not consumers:  # a root: the loss, at scale 1
                value = 1.0
                break
            path.append(cur)
            nxt = consumers[0]
            if nxt in self._sent:
                value = self._sent[nxt]
                break
            cur = nxt
        for n in path:
            self._into[n] = value
        return value

    def sent(self, node) -> float:
        return self._sent[node] if node in self._sent else self.into(node)

    @staticmethod
    def _layer_of(node) -> int:
        return node.layer_id if isinstance(node, (_ENTER, _EXIT)) else -1

    def _post_hook(self, consumer: int, leaf_slots, join_slots):
        def hook(grad_inputs, grad_outputs):
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
                if g is None:
                    continue
                out = _owned_copy(g)
                self.core.weight_gradient(layer, out.data_ptr(), out.numel(), scale)
                grads[k] = out
            return tuple(grads)
        return hook

    def _join_hook(self, producer: int, layer: int):
        def hook(grad_outputs):
            parts = self._parts.pop(producer, None)
            if not parts:
                return None
            contiguous = [(j, g.contiguous(), s) for j, g, s in parts]
            target = self.core.join_target([self.core.max_abs(g.data_ptr(), g.numel()) for _, g, _ in contiguous],
                                           [s for _, _, s in contiguous])
            if len({s for _, _, s in contiguous}) > 1:
                self.joins += 1
            sums: Dict[int, torch.Tensor] = {}
            for j, g, s in contiguous:
                term = g * (target / s)  # fp32, the factor rounded to float as the C++ join does
                if j in sums:
                    sums[j].add_(term)
                else:
                    sums[j] = term
            grads = list(grad_outputs)
            for j, total in sums.items():
                total = total.contiguous()
                self.core.round_join(layer, total.data_ptr(), total.numel())
                grads[j] = total
            self._into[self._nodes[producer]] = target
            return tuple(grads)
        return hook

    # ---- what the boundary Functions call -------------------------------------------------------
    def loss_backward(self, ctx, g: torch.Tensor) -> None:
        s0 = self.core.loss_gradient(g.data_ptr(), g.numel())
        self._sent[ctx] = s0
        if not self._callback_queued:
            self._callback_queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)

    def exit_backward(self, ctx, g: torch.Tensor) -> None:
        scale = self.into(ctx)
        self.core.note_layer(ctx.layer_id, scale)
        self.core.round_received(ctx.layer_id, g.data_ptr(), g.numel())
        self._received[(ctx.layer_id, ctx.call)] = g

    def enter_backward(self, ctx, g: torch.Tensor) -> None:
        scale_in = self.into(ctx)
        layer = self.layers[ctx.layer_id]
        received: Optional[torch.Tensor] = self._received.get((ctx.layer_id, ctx.call))
        weight = layer.weight.detach().contiguous() if layer.parametric else None
        s = self.core.upstream(ctx.layer_id, g.data_ptr(), list(g.shape),
                               received.data_ptr() if received is not None else 0,
                               list(received.shape) if received is not None else [],
                               weight.data_ptr() if weight is not None else 0,
                               list(weight.shape) if weight is not None else [], scale_in)
        self._sent[ctx] = s * scale_in

    # set by the Scaler: what to do when autograd has finished a backward pass
    on_backward_done = None

    def _backward_done(self) -> None:
        self._reset_graph()
        if self.on_backward_done is not None:
            self.on_backward_done()
