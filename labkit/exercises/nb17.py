"""Exercise of notebooks/17_capstone.ipynb.

Introduced in notebooks/17_capstone.ipynb.

``17_causal_attention``: write the attention of a GPT by hand, softmax(QKᵀ/√d + M)·V with the
causal mask M (0 where key j ≤ query i, −∞ after it: Vaswani et al. 2017, §3.2.3, "masking out
(setting to −∞) all values in the input of the softmax which correspond to illegal
connections"). The checker compares the output and the gradients of q, k and v with
``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` on several shapes,
and checks that changing a future key or value leaves every earlier output alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from labkit.exercises import ExerciseFailed, exercise

SHAPES = ((1, 1, 1, 4), (2, 3, 5, 8), (3, 2, 16, 4))  # (B, heads, T, head_dim)
RTOL, ATOL = 1e-5, 1e-5

PROMPT = """Write `my_causal_attention(q, k, v)` for tensors of shape (B, heads, T, d): the
scores q·kᵀ/√d, the causal mask (a query at position i sees keys 0..i, never a later one),
softmax over the keys, then the weighted sum of v. Use plain tensor operations (no
scaled_dot_product_attention)."""


def reference_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal scaled dot-product attention (reference of ``17_causal_attention``).

    Introduced in notebooks/17_capstone.ipynb (Vaswani et al. 2017, §3.2.1 and §3.2.3).

    Args:
        q, k, v: (B, heads, T, d).

    Returns:
        torch.Tensor: (B, heads, T, d).
    """
    T, d = q.shape[-2], q.shape[-1]  # time, head width
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)  # j > i
    scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _inputs(shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g, requires_grad=True) for _ in range(3)]


def _hint(got: torch.Tensor, q, k, v) -> str:
    with torch.no_grad():
        full = F.scaled_dot_product_attention(q, k, v)
        if torch.allclose(got, full, rtol=1e-4, atol=1e-4):
            return "it attends to every key: mask the future (keys after the query)"
        unscaled = F.scaled_dot_product_attention(q * math.sqrt(q.shape[-1]), k, v, is_causal=True)
        if torch.allclose(got, unscaled, rtol=1e-4, atol=1e-4):
            return "divide the scores by √d (the head width)"
        if torch.isnan(got).any():
            return "NaN: a row has every key masked; a query must see its own position"
    return "compare your mask with (keys 0..i visible to query i)"


@exercise("17_causal_attention", reference=reference_causal_attention, prompt=PROMPT)
def check_causal_attention(fn: Callable[..., torch.Tensor]) -> dict[str, Any]:
    """Check the learner's causal attention against PyTorch's, values and gradients.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        fn: the learner's ``my_causal_attention(q, k, v)``.

    Returns:
        ``{"shapes": [...]}``: the shapes checked.

    Raises:
        ExerciseFailed: wrong shape, output, gradient, or a past output that depends on the
            future.
    """
    for i, shape in enumerate(SHAPES):
        q, k, v = _inputs(shape, 17 + i)
        got = fn(q, k, v)
        if not isinstance(got, torch.Tensor) or got.shape != shape:
            raise ExerciseFailed(
                f"for inputs of shape {shape} expected an output of the same shape, got "
                f"{getattr(got, 'shape', type(got).__name__)}"
            )
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            raise ExerciseFailed(f"shape {shape}: the output differs; {_hint(got, q, k, v)}")
        w = torch.randn(shape, generator=torch.Generator().manual_seed(i))
        if not got.requires_grad:
            raise ExerciseFailed("the output has no gradient: do not detach or use no_grad")
        mine = torch.autograd.grad((got * w).sum(), (q, k, v))
        ref = torch.autograd.grad((want * w).sum(), (q, k, v))
        for name, a, b in zip("qkv", mine, ref, strict=True):
            if not torch.allclose(a, b, rtol=1e-4, atol=1e-5):
                raise ExerciseFailed(f"shape {shape}: the gradient of {name} differs")
        T = shape[2]
        if T > 1:
            k2, v2 = k.detach().clone(), v.detach().clone()
            k2[:, :, -1] += 1.0
            v2[:, :, -1] += 1.0
            with torch.no_grad():
                past = fn(q.detach(), k2, v2)[:, :, :-1]
            if not torch.allclose(past, got.detach()[:, :, :-1], rtol=RTOL, atol=ATOL):
                raise ExerciseFailed(
                    f"shape {shape}: changing the last key and value changed earlier outputs"
                )
    return {"shapes": [list(s) for s in SHAPES]}
