"""The floating-point operations of the matrix products a block of code runs, counted as they run.

Introduced in notebooks/16_context_parallel.ipynb.

Every matrix product called inside the block (``@``, ``torch.matmul``, ``mm``, ``bmm``) passes
through a ``torch.overrides.TorchFunctionMode`` that adds 2·m·k·n per product (a multiply and an
add per term), times the batch — the count ``torch.utils.flop_counter.FlopCounterMode`` gives
for matrix-matrix products (it leaves matrix-vector and dot products out; this counts them). That
one counts every aten op but imports ``torch._dynamo`` on first use, seconds in each fresh rank;
this one counts only the products, which is where attention's work is. ``F.linear`` and fused
kernels (``scaled_dot_product_attention``) are not seen.

    with lk.profile.matmul_flops() as flops:
        y = q @ k.transpose(-2, -1)
    flops.total          # 2 · b·a · s · d · s
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MatmulFlops", "matmul_flops"]

_PRODUCTS = ("matmul", "__matmul__", "__rmatmul__", "mm", "bmm")


@dataclass
class MatmulFlops:
    """FLOPs of the matrix products seen so far: the total and the count per function."""

    total: int = 0
    calls: dict[str, int] = field(default_factory=dict)

    def see(self, name: str, a: Any, b: Any, out: Any) -> None:
        """Add one product ``a @ b`` (reflected for ``__rmatmul__``) that returned ``out``."""
        if name == "__rmatmul__":
            a, b = b, a
        if a.dim() == 1 and b.dim() == 1:  # a dot product
            self.total += 2 * a.shape[0]
        else:  # every output element is a k-term dot product
            self.total += 2 * math.prod(out.shape) * a.shape[-1]
        self.calls[name] = self.calls.get(name, 0) + 1


@contextmanager
def matmul_flops() -> Iterator[MatmulFlops]:
    """Count the FLOPs of every matrix product run while the block runs.

    Returns:
        A context manager yielding the ``MatmulFlops`` that fills up inside the block.
    """
    from torch.overrides import TorchFunctionMode

    record = MatmulFlops()

    class _Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if name in _PRODUCTS and len(args) == 2:
                record.see(name, args[0], args[1], out)
            return out

    with _Count():
        yield record
