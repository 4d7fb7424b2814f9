"""The largest tensor a block of code creates: where a score matrix shows its size.

Introduced in notebooks/16_context_parallel.ipynb.

``saved_tensors`` says what a forward keeps until backward; this says how big the biggest
tensor made on the way was — the s×s scores of plain attention, one (s/n)×(s/n) block of ring
attention. Every torch function called inside the block (``@``, ``softmax``, ``exp``, ...)
passes through a ``torch.overrides.TorchFunctionMode`` that looks at what it returns; the
insides of a fused kernel (``scaled_dot_product_attention``) are not seen.

    with lk.profile.largest_tensor() as big:
        y = lk.parallel.context.softmax_attention(q, k, v)
    big.nbytes, big.shape, big.op
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["LargestTensor", "largest_tensor"]


@dataclass
class LargestTensor:
    """The largest tensor returned by a torch function so far: bytes, shape, function name."""

    nbytes: int = 0
    shape: tuple[int, ...] = ()
    op: str = ""

    def see(self, value: Any, op: str) -> None:
        """Record ``value`` (a tensor, or a tuple/list of them) if it is the largest yet."""
        for t in value if isinstance(value, tuple | list) else (value,):
            tensor = hasattr(t, "numel") and hasattr(t, "element_size") and hasattr(t, "shape")
            n = t.numel() * t.element_size() if tensor else 0
            if n > self.nbytes:
                self.nbytes, self.shape, self.op = n, tuple(t.shape), op


@contextmanager
def largest_tensor() -> Iterator[LargestTensor]:
    """Record the largest tensor any torch function returns while the block runs.

    Returns:
        A context manager yielding the ``LargestTensor`` (bytes of the tensor as it is seen: a
        view counts its own elements).
    """
    from torch.overrides import TorchFunctionMode

    record = LargestTensor()

    class _Watch(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            record.see(out, getattr(func, "__name__", str(func)))
            return out

    with _Watch():
        yield record
