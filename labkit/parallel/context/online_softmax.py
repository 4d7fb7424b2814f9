"""Attention one block of keys at a time: the online (log-sum-exp) softmax and its backward.

Introduced in notebooks/16_context_parallel.ipynb.

softmax over all keys need not see all keys at once (Milakov and Gimelshein 2018, "Online
normalizer calculation for softmax"; Rabe and Staats 2021; FlashAttention, Dao et al. 2022, §3.1).
For one query row, a block j of keys gives its own normalised output ``o_j`` and the log of its
normaliser ``ℓ_j = log Σ_k exp(s_k)``; two blocks merge exactly:

    ℓ = log(exp ℓ_1 + exp ℓ_2),   o = exp(ℓ_1 − ℓ)·o_1 + exp(ℓ_2 − ℓ)·o_2

so a rank can fold in the key/value blocks in any order as they arrive around a ring, keeping
only (out, ℓ) per query. Backward needs no s×s matrix either (FlashAttention-2, Dao 2023,
Algorithm 2): with the final ℓ the probabilities of any block are ``exp(s − ℓ)`` again, and
with ``Δ = rowsum(dO ∘ O)`` its gradients follow block by block.

Blocks are computed in fp32 for fp32, bf16 or fp16 inputs (ring-flash-attention and PyTorch's
context parallel accumulate in fp32 too), in fp64 for fp64 inputs. :func:`softmax_attention` is
the plain reference: it materialises the s×s probabilities (and keeps them for backward).
"""

from __future__ import annotations

import math

import torch

__all__ = ["attention_block", "attention_block_backward", "merge_blocks", "softmax_attention"]


def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the accumulation dtype: fp32, or fp64 for fp64 inputs."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float, kind: str) -> torch.Tensor:
    s = (_acc(q) @ _acc(k).transpose(-2, -1)) * scale  # (B, A, cq, ck)
    if kind == "diagonal":  # the same chunk: key j is visible to query i iff j <= i
        n = s.shape[-1]
        later = torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1)
        s = s.masked_fill(later, float("-inf"))
    elif kind != "full":
        raise ValueError(f"kind must be 'full' or 'diagonal', got {kind!r}")
    return s


def attention_block(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, kind: str = "full"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries over one block of keys: the block's output and log-normaliser.

    Args:
        q: (B, A, cq, D) queries.
        k, v: (B, A, ck, D) one block of keys and values.
        scale: the scores' factor (1/√D).
        kind: ``"full"``, or ``"diagonal"`` for the causal mask of a chunk with itself.

    Returns:
        tuple: out (B, A, cq, D), normalised within the block; lse (B, A, cq), the log of the
        block's softmax normaliser per query; both fp32 (fp64 for fp64 inputs).

    Raises:
        ValueError: an unknown ``kind``.
    """
    s = _scores(q, k, scale, kind)
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ _acc(v), lse


def merge_blocks(
    out: torch.Tensor | None,
    lse: torch.Tensor | None,
    block_out: torch.Tensor,
    block_lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one block's (out, lse) into the running ones (the online softmax).

    Args:
        out, lse: the running output (B, A, c, D) and log-normaliser (B, A, c); None before the
            first block.
        block_out, block_lse: :func:`attention_block`'s result for one more block of keys.

    Returns:
        tuple: the output and log-normaliser over every key seen so far, fp32.
    """
    if out is None or lse is None:
        return block_out, block_lse
    new = torch.logaddexp(lse, block_lse)
    out = out * torch.exp(lse - new).unsqueeze(-1) + block_out * torch.exp(
        block_lse - new
    ).unsqueeze(-1)
    return out, new


def attention_block_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    scale: float,
    kind: str = "full",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients of one (query block, key block) pair, given the final log-normaliser.

    FlashAttention-2 (Dao 2023), Algorithm 2: P = exp(S − ℓ), dV = Pᵀ dO, dP = dO Vᵀ,
    dS = P ∘ (dP − Δ), dQ = dS K·scale, dK = dSᵀ Q·scale.

    Args:
        q: (B, A, cq, D); k, v: (B, A, ck, D).
        dout: (B, A, cq, D), the gradient of the final output of these queries.
        lse: (B, A, cq), the final log-normaliser of these queries (over every key).
        delta: (B, A, cq), ``rowsum(dout ∘ out)`` with the final output.
        scale: the scores' factor.
        kind: ``"full"`` or ``"diagonal"``.

    Returns:
        tuple: this pair's contributions to dq (B, A, cq, D), dk and dv (B, A, ck, D), fp32.
    """
    p = torch.exp(_scores(q, k, scale, kind) - _acc(lse).unsqueeze(-1))  # masked scores → 0
    dout = _acc(dout)
    dv = p.transpose(-2, -1) @ dout
    ds = p * (dout @ _acc(v).transpose(-2, -1) - _acc(delta).unsqueeze(-1))
    return (ds @ _acc(k)) * scale, (ds.transpose(-2, -1) @ _acc(q)) * scale, dv


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(Q Kᵀ·scale) V with the whole s×s matrix: the single-process reference.

    Autograd keeps q, k, v, the s×s probabilities and (causal) the s×s boolean mask.

    Args:
        q, k, v: (B, A, s, D).
        causal: mask later keys.
        scale: the scores' factor (None: 1/√D).

    Returns:
        torch.Tensor: (B, A, s, D).
    """
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(
            torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1), float("-inf")
        )
    return s.softmax(dim=-1) @ v
