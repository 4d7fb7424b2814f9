"""What attention keeps for backward, and its largest score matrix: whole, or ring by blocks.

Introduced in notebooks/16_context_parallel.ipynb.

The plain attention softmax(QKᵀ)V keeps the s×s probabilities per head for backward (Korthikanti
et al. 2022, §4.1: 2as²b bytes in 16 bits, the 5as/h term's largest part), and a causal mask of
s×s booleans. Ring attention (``labkit.parallel.context``) keeps, on each of p ranks, its own
q, k, v and output (s/p tokens each) and one fp32 log-sum-exp per query, and never builds more
than one (s/n)×(s/n) score block at a time (n = p chunks contiguous, 2p zig-zag). Pure
arithmetic: compare with ``labkit.profile.saved_tensors`` and ``largest_tensor``.
"""

from __future__ import annotations

__all__ = ["attention_saved_bytes", "score_block_bytes"]

LSE_BYTES = 4  # the log-sum-exp is kept in fp32


def attention_saved_bytes(
    seq_len: int,
    batch: int,
    heads: int,
    head_dim: int,
    *,
    kind: str = "softmax",
    world_size: int = 1,
    causal: bool = True,
    bytes_per_element: int = 4,
) -> dict[str, float]:
    """Bytes attention keeps for backward on one rank, tensor by tensor.

    Args:
        seq_len: s, the whole sequence.
        batch: b.
        heads: a.
        head_dim: d.
        kind: ``"softmax"`` (``softmax_attention`` on one process: q and k for QKᵀ, the s×s
            probabilities, v, and the causal mask) or ``"ring"`` (``ring_attention`` on each
            of ``world_size`` ranks; ``world_size=1`` is a flash-style kernel on one process).
        world_size: p (``"ring"`` only).
        causal: the softmax reference keeps its s×s boolean mask (1 byte each).
        bytes_per_element: bytes of q, k, v and the output (and the probabilities).

    Returns:
        dict[str, float]: tensor → bytes; sum it for the total.

    Raises:
        ValueError: an unknown kind, or s not divisible by p.
    """
    s, b, a, d, e = seq_len, batch, heads, head_dim, bytes_per_element
    if kind == "softmax":
        out = {"q, k, v": 3 * b * a * s * d * e, "probabilities": b * a * s * s * e}
        if causal:
            out["causal mask"] = s * s * 1
        return out
    if kind != "ring":
        raise ValueError(f"kind must be 'softmax' or 'ring', got {kind!r}")
    if seq_len % world_size:
        raise ValueError(f"sequence length {s} is not divisible by {world_size} ranks")
    local = b * a * (s // world_size)
    return {"q, k, v, output": 4 * local * d * e, "log-sum-exp": local * LSE_BYTES}


def score_block_bytes(
    seq_len: int, batch: int, heads: int, world_size: int = 1, layout: str = "zigzag"
) -> float:
    """Bytes of the largest score matrix one rank builds: b·a·(s/n)² fp32 (n chunks).

    Args:
        seq_len: s.
        batch: b.
        heads: a.
        world_size: p (1: the whole s×s matrix).
        layout: ``"contiguous"`` (n = p) or ``"zigzag"`` (n = 2p, blocks of one chunk each).

    Returns:
        float: bytes of one score block in fp32.

    Raises:
        ValueError: an unknown layout.
    """
    if layout not in ("contiguous", "zigzag"):
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got {layout!r}")
    n = 1 if world_size == 1 else (world_size if layout == "contiguous" else 2 * world_size)
    return batch * heads * (seq_len / n) ** 2 * 4
