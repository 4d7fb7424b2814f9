"""A stage's backward in two halves: input gradient now (B), weight gradients later (W).

Introduced in notebooks/11_pipeline_parallel.ipynb.

Zero-bubble pipelines (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", §2) split a stage's
backward into **B**, the gradient of the stage's input, which the previous stage waits for,
and **W**, the gradients of its weights, which no other stage waits for and can therefore run
later, in what would have been a bubble. For a linear layer ``y = x Wᵀ + b``: B is
``dx = dy W``; W is ``dW = dyᵀ x`` and ``db = Σ dy`` — both need ``dy``, only W needs ``x``.

How it is done with autograd (``torch.distributed.pipelining._backward`` does the same with
more cases; this is its idea, small enough to read):

1. **The graph.** Walk the autograd graph from the output. A node is on the *input side* when
   its result depends on the stage's input ``x``. For each parameter, the first input-side
   nodes its gradient path meets are its *intermediates* — for ``nn.Linear``, the
   ``AddmmBackward0`` node that also produces ``dx``. Parameters that share an intermediate form
   one group (a Linear's weight and bias).
2. **B** (``backward_input``): pre-hooks on the intermediates capture the gradient flowing
   into them, and ``torch.autograd.grad(y, x, dy, retain_graph=True)`` computes ``dx`` only —
   autograd skips the weight-gradient products, since no parameter was asked for.
3. **W** (``backward_weight``): per group, ``torch.autograd.grad`` from the intermediates'
   ``GradientEdge`` with the captured gradients to the parameters' edges runs only the weight
   side of those nodes; the result is added to ``.grad``. When a group has several
   intermediates (a parameter used twice), each is clamped to its captured gradient, so a path
   from one to another is not counted twice.

**Memory held from B to W**, per micro-batch: the retained graph — every tensor the forward
saved for backward (``retain_graph=True`` keeps them all, also those only B needed, such as a
ReLU's mask) — plus the gradient captured at each intermediate: for an MLP stage one
``[batch, out_features]`` tensor per Linear (``PendingWeights.held_bytes``). So a micro-batch's
activations live from its F to its W: the runtime counts it in flight until then.

The simplest alternative — ``autograd.grad(y, x, dy, retain_graph=True)`` for B, then
``autograd.grad(y, params, dy)`` for W — is also exact, but its W re-runs the chain of input
gradients through every layer: nearly all of B's work again. Not used.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

__all__ = ["PendingWeights", "backward_input", "backward_weight"]


@dataclass
class _Group:
    params: list[torch.Tensor]
    intermediates: list[Node]
    grads: dict[Node, tuple[torch.Tensor | None, ...]] = field(default_factory=dict)


@dataclass
class PendingWeights:
    """What B leaves for W: parameter groups, their intermediates and captured gradients.

    Attributes:
        groups: one entry per group of parameters sharing intermediates.
    """

    groups: list[_Group]

    @property
    def held_bytes(self) -> int:
        """Bytes of the gradients captured at the intermediates (the retained graph aside)."""
        return sum(
            g.numel() * g.element_size()
            for group in self.groups
            for grads in group.grads.values()
            for g in grads
            if g is not None
        )


def _consumers(root: Node) -> dict[Node, list[Node]]:
    """For each node reachable from ``root``, the nodes that take its result (edges reversed)."""
    out: dict[Node, list[Node]] = defaultdict(list)
    seen, queue = {root}, deque([root])
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            out[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return out


def _downstream(starts: Iterable[Node], consumers: dict[Node, list[Node]]) -> set[Node]:
    """Every node whose result depends on one of ``starts`` (``starts`` included)."""
    seen = set(starts)
    queue = deque(seen)
    while queue:
        for nxt in consumers.get(queue.popleft(), []):
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return seen


def _intermediates(start: Node, input_side: set[Node], consumers) -> list[Node]:
    """The first input-side nodes on the paths from a parameter's node towards the output."""
    found, seen, queue = [], {start}, deque([start])
    while queue:
        for nxt in consumers.get(queue.popleft(), []):
            if nxt in seen:
                continue
            seen.add(nxt)
            if nxt in input_side:
                found.append(nxt)
            else:
                queue.append(nxt)
    return found


def _groups(output: torch.Tensor, x: torch.Tensor, params: list[torch.Tensor]) -> list[_Group]:
    consumers = _consumers(output.grad_fn)
    # the output's own node counts as input side, so a parameter that reaches the output
    # without touching x (``y = f(x) + p`` or an unused x) still gets its gradient in W
    input_side = _downstream([get_gradient_edge(x).node], consumers) | {output.grad_fn}
    by_node: dict[Node, _Group] = {}
    for p in params:
        mids = _intermediates(get_gradient_edge(p).node, input_side, consumers)
        if not mids:
            continue  # not used by this forward: no gradient, as with y.backward()
        group = _Group([p], mids)
        for other in {id(by_node[m]): by_node[m] for m in mids if m in by_node}.values():
            group.params += other.params  # they share an intermediate: one group
            group.intermediates += [m for m in other.intermediates if m not in group.intermediates]
        for m in group.intermediates:
            by_node[m] = group
    return list({id(g): g for g in by_node.values()}.values())


def backward_input(
    output: torch.Tensor,
    grad_output: torch.Tensor | None,
    x: torch.Tensor,
    params: Iterable[torch.Tensor],
) -> tuple[torch.Tensor, PendingWeights]:
    """B: the gradient of the stage's input only; what W needs is kept for later.

    Qi et al. 2023 (Zero Bubble Pipeline Parallelism), §2: B computes ``∂L/∂x`` so the previous
    stage can go on; the weight gradients wait for ``backward_weight``.

    Args:
        output: the stage's output (or, on the last stage, the scalar loss).
        grad_output: ``∂L/∂output`` received from the next stage (None for a scalar loss).
        x: the stage's input; it must require grad (the first stage's too: make it a leaf
            with ``requires_grad_()``, so B runs the activation gradients through every layer).
        params: the stage's parameters.

    Returns:
        ``(dx, pending)``: the input's gradient, and what ``backward_weight`` needs.

    Raises:
        ValueError: ``x`` does not require grad or ``output`` has no graph.
    """
    if not x.requires_grad or output.grad_fn is None:
        raise ValueError("backward_input needs x.requires_grad and an output with a graph")
    groups = _groups(output, x, [p for p in params if p.requires_grad])
    handles = []
    for group in groups:
        for node in group.intermediates:

            def capture(grads, group=group, node=node):
                group.grads[node] = tuple(grads)

            handles.append(node.register_prehook(capture))
    try:
        (dx,) = torch.autograd.grad(output, x, grad_output, retain_graph=True)
    finally:
        for h in handles:
            h.remove()
    return dx, PendingWeights(groups)


def backward_weight(pending: PendingWeights) -> None:
    """W: the weight gradients B left pending, added to each parameter's ``.grad``.

    Args:
        pending: what ``backward_input`` returned for this micro-batch.

    Returns:
        None. ``pending`` is emptied, which frees the retained graph.
    """
    for group in pending.groups:
        edges, grads = [], []
        for node in group.intermediates:
            for i, g in enumerate(group.grads.get(node, ())):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(g)
        if not edges:
            continue
        clamps = []
        if len(group.intermediates) > 1:  # one intermediate may feed another: keep B's value
            for node in group.intermediates:
                saved = group.grads.get(node)
                clamps.append(node.register_prehook(lambda _g, saved=saved: saved))
        try:
            targets = [get_gradient_edge(p) for p in group.params]
            dws = torch.autograd.grad(edges, targets, grads, retain_graph=True)
        finally:
            for h in clamps:
                h.remove()
        for p, dw in zip(group.params, dws, strict=True):
            if p.grad is None:
                p.grad = dw
            else:
                p.grad.add_(dw)  # in place, as autograd accumulates (views of .grad stay valid)
    pending.groups.clear()
