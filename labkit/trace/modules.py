"""Spans for each layer's forward and backward, recorded by module hooks.

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb.

A span around ``loss.backward()`` also covers the time a data-parallel wrapper spends
*waiting* for its last all-reduces (they finish before ``backward()`` returns), so it
cannot tell computing from waiting. ``trace_modules(model)`` records what was computed
instead: for each chosen submodule, a ``"fwd <name>"`` span from its forward pre-hook to its
forward hook, and a ``"bwd <name>"`` span from the moment the gradient of its output has
been computed to the moment the gradient of its input has (``Tensor.register_hook`` on both,
set at each forward) — or, for a module whose inputs need no gradient (the first layer),
the gradient of its first parameter. Module full-backward hooks would not do: for a first
layer they fire before its backward has run (and warn). The spans land in this rank's
``lk.trace.events()``. Imports no torch.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from labkit.trace.spans import COMPUTE, span

__all__ = ["ModuleTracer", "trace_modules"]


class ModuleTracer:
    """The hooks ``trace_modules`` installed; ``remove()`` takes them off again.

    Attributes:
        names: the traced submodules' names, in registration order.
    """

    def __init__(self, device: Any = None) -> None:
        self.device = device  # a GPU's spans synchronise its current stream (``span``)
        self.names: list[str] = []
        self._handles: list[Any] = []
        self._open: dict[tuple[str, str], AbstractContextManager] = {}

    def _start(self, phase: str, name: str) -> None:
        cm = span(f"{phase} {name}", kind=COMPUTE, device=self.device, module=name, phase=phase)
        cm.__enter__()
        self._open[(phase, name)] = cm

    def _stop(self, phase: str, name: str) -> None:
        cm = self._open.pop((phase, name), None)
        if cm is not None:
            cm.__exit__(None, None, None)

    def _forward_done(self, name: str, module: Any, args: Any, output: Any) -> None:
        self._stop("fwd", name)
        outs = _grad_tensors(output)
        if not outs:  # no backward through this module (no_grad, or frozen)
            return
        ends = _grad_tensors(args) or [p for p in module.parameters() if p.requires_grad][:1]
        if not ends:
            return
        outs[0].register_hook(lambda g: self._start("bwd", name))
        end = ends[0]
        if end.grad_fn is not None:  # a non-leaf input: this hook dies with the graph
            end.register_hook(lambda g: self._stop("bwd", name))
            return
        handle: list[Any] = []  # a parameter lives on: its hook must go after one firing

        def stop(g: Any) -> None:
            handle[0].remove()
            self._stop("bwd", name)

        handle.append(end.register_hook(stop))

    def remove(self) -> None:
        """Remove every hook (spans already recorded stay).

        Returns:
            None.
        """
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._open.clear()

    def __enter__(self) -> ModuleTracer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def trace_modules(module: Any, names: list[str] | None = None) -> ModuleTracer:
    """Record a compute span for every forward and backward of ``module``'s children.

    Args:
        module: a ``torch.nn.Module``.
        names: which submodules to trace (names as in ``module.named_modules()``); default:
            the direct children. Their inputs need not require gradients.

    The spans synchronise the device of ``module``'s first parameter (on a GPU, its current
    stream; ``lk.trace.span``), so a layer's span covers its kernels.

    Returns:
        ModuleTracer: its ``remove()`` (or leaving ``with trace_modules(m):``) removes the hooks.

    Raises:
        ValueError: a name that is not a submodule, or nothing to trace.
    """
    found = dict(module.named_modules())
    chosen = names if names is not None else [n for n, _ in module.named_children()]
    missing = [n for n in chosen if n not in found or n == ""]
    if missing or not chosen:
        raise ValueError(f"no submodules named {missing} to trace" if missing else "no children")
    tracer = ModuleTracer(next((p.device for p in module.parameters()), None))
    for name in chosen:
        sub = found[name]
        tracer.names.append(name)
        tracer._handles += [
            sub.register_forward_pre_hook(lambda m, a, n=name: tracer._start("fwd", n)),
            sub.register_forward_hook(lambda m, a, o, n=name: tracer._forward_done(n, m, a, o)),
        ]
    return tracer


def _grad_tensors(value: Any) -> list[Any]:
    """Tensors in ``value`` (a tensor, or a tuple/list/dict of them) that require grad."""
    if isinstance(value, list | tuple):
        return [t for v in value for t in _grad_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _grad_tensors(v)]
    return [value] if getattr(value, "requires_grad", False) and hasattr(value, "grad_fn") else []
