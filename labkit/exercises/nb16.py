"""Exercises of notebooks/16_context_parallel.ipynb.

Introduced in notebooks/16_context_parallel.ipynb.

``16_online_softmax``: the merge at the heart of ring attention (Milakov and Gimelshein 2018;
FlashAttention, Dao et al. 2022, §3.1). Attention of some queries over one block of keys gives
the block's normalised output ``o_i`` and the log of its normaliser ``ℓ_i = log Σ exp(s)``; two
blocks merge exactly into ``ℓ = log(exp ℓ_1 + exp ℓ_2)`` and
``o = exp(ℓ_1 − ℓ)·o_1 + exp(ℓ_2 − ℓ)·o_2``. The checker (one process, no ranks) cuts the keys
into blocks of random sizes, folds them with the learner's merge in several random orders, and
compares with softmax attention over all keys in float64 — once with ordinary scores, once with
scores in the hundreds, where ``exp(ℓ)`` overflows float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from labkit.exercises import ExerciseFailed, exercise
from labkit.parallel.context import attention_block, merge_blocks

B, A, Q, K, D = 2, 2, 8, 40, 4  # batch, heads, queries, keys, head dim
N_BLOCKS = 5  # key blocks per fold, of random sizes
N_ORDERS = 3  # random orders per scale
SCALES = {"ordinary": None, "large": 200.0}  # the largest |score|; None: as drawn (about 3)
RTOL, ATOL = 1e-4, 2e-4  # float32 blocks against float64; scores of 200 carry ~1e-5 error
LSE_ATOL = 1e-3

PROMPT = """Write `my_merge(out1, lse1, out2, lse2)`: the outputs (B, A, q, D) and log-normalisers
(B, A, q) of attention over two disjoint blocks of keys (each output normalised within its
block) → the output and log-normaliser over both, as a tuple (out, lse). lse is
log(exp(lse1) + exp(lse2)) — compute it without overflow (torch.logaddexp) — and each block's
output is weighted by its share of the whole normaliser, exp(lse_i − lse)."""


def reference_merge(
    out1: torch.Tensor, lse1: torch.Tensor, out2: torch.Tensor, lse2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two blocks' (out, lse): the online softmax (reference of ``16_online_softmax``).

    Args:
        out1, out2: (B, A, q, D), each normalised within its block of keys.
        lse1, lse2: (B, A, q), the log of each block's softmax normaliser.

    Returns:
        tuple: (out, lse) over both blocks.
    """
    return merge_blocks(out1, lse1, out2, lse2)


def _data(scale: float | None, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, A, n, D, generator=g) for n in (Q, K, K))
    if scale is not None:  # stretch the scores so that the largest |score| is `scale`
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(D)
        q = q * (scale / scores.abs().max())
    return q, k, v


def _blocks(q, k, v, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Cut the keys into N_BLOCKS random sizes; each block's (out, lse), float32."""
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(torch.randperm(K - 1, generator=g)[: N_BLOCKS - 1].add(1).tolist())
    bounds = list(zip([0, *cuts], [*cuts, K], strict=True))
    return [attention_block(q, k[:, :, i:j], v[:, :, i:j], D**-0.5) for i, j in bounds]


def _want(q, k, v) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax attention over every key, and its log-normaliser, in float64."""
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(D)
    return s.softmax(-1) @ v.double(), s.logsumexp(-1)


def _fold(merge: Callable, blocks, order) -> tuple[Any, Any]:
    out, lse = blocks[order[0]]
    for j in order[1:]:
        got = merge(out, lse, *blocks[j])
        if not isinstance(got, tuple | list) or len(got) != 2:
            raise ExerciseFailed("my_merge must return a tuple (out, lse)")
        out, lse = got
    return out, lse


def _close(got: Any, want: torch.Tensor, atol: float) -> bool:
    return (
        isinstance(got, torch.Tensor)
        and got.shape == want.shape
        and torch.allclose(got.double(), want.double(), rtol=RTOL, atol=atol)
    )


def _average(o1, l1, o2, l2):  # every block weighted alike
    return (o1 + o2) / 2, torch.logaddexp(l1, l2)


def _sum(o1, l1, o2, l2):  # no rescaling: the normalised outputs added
    return o1 + o2, torch.logaddexp(l1, l2)


def _diagnose(merge: Callable, blocks, order) -> str:
    """Why a fold is wrong, from its first merge and the wrong merges learners write."""
    (o1, l1), (o2, l2) = blocks[order[0]], blocks[order[1]]
    out, lse = merge(o1.clone(), l1.clone(), o2.clone(), l2.clone())
    if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
        return (
            "it returned inf or nan: exp of a log-normaliser in the hundreds overflows "
            "float32 (beyond 88). Subtract the larger one first — torch.logaddexp does."
        )
    if _close(lse, torch.maximum(l1, l2), 1e-6) and not _close(lse, torch.logaddexp(l1, l2), 1e-6):
        return ("lse is the max of the two; the merged normaliser is their sum: "
                "lse = log(exp(lse1) + exp(lse2)) = torch.logaddexp(lse1, lse2).")  # fmt: skip
    for wrong, why in ((_average, "it averages the outputs: each block must count by its share "
                        "of the normaliser, exp(lse_i − lse), not by 1/2."),
                       (_sum, "it adds the outputs without rescaling: each is normalised within "
                        "its block; weight it by exp(lse_i − lse).")):  # fmt: skip
        if _close(_fold(merge, blocks, order)[0], _fold(wrong, blocks, order)[0], 1e-6):
            return why
    if not _close(lse, torch.logaddexp(l1, l2), LSE_ATOL):
        return "lse must be log(exp(lse1) + exp(lse2))."
    return "weight each block's output by exp(lse_i − lse), with lse the merged one."


@exercise("16_online_softmax", reference=reference_merge, prompt=PROMPT)
def check_online_softmax(merge: Callable) -> dict[str, Any]:
    """Fold random key blocks in random orders with ``merge``; compare with float64 softmax.

    Args:
        merge: the learner's ``my_merge(out1, lse1, out2, lse2) -> (out, lse)``.

    Returns:
        ``{"folds": n, "largest_lse": x}``: folds checked and the largest log-normaliser seen.

    Raises:
        ExerciseFailed: a fold's output or log-normaliser differs from the float64 reference
            (with the likely mistake: averaging, no rescaling, max for logaddexp, overflow), or
            the function does not return (out, lse).
        NotImplementedError: the function is not written yet.
    """
    folds, largest = 0, 0.0
    for n, (name, scale) in enumerate(SCALES.items()):
        q, k, v = _data(scale, 160 + n)
        blocks = _blocks(q, k, v, 170 + n)
        want_out, want_lse = _want(q, k, v)
        gens = [torch.Generator().manual_seed(180 + 10 * n + i) for i in range(N_ORDERS)]
        orders = [torch.randperm(N_BLOCKS, generator=g).tolist() for g in gens]
        for order in orders:
            out, lse = _fold(merge, blocks, order)
            if not (_close(out, want_out, ATOL) and _close(lse, want_lse, LSE_ATOL)):
                raise ExerciseFailed(
                    f"with {name} scores (largest log-normaliser {want_lse.max():.1f}), blocks "
                    f"folded in the order {order} differ from softmax over all keys: "
                    + _diagnose(merge, blocks, order)
                )
            folds += 1
        largest = max(largest, want_lse.max().item())
    return {"folds": folds, "largest_lse": largest}
