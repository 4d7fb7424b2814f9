"""How a sequence is laid out over context-parallel ranks: contiguous or zig-zag (load-balanced).

Introduced in notebooks/16_context_parallel.ipynb.

Ring attention (Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise Transformers for
Near-Infinite Context") gives each of p ranks a block of the sequence. With a causal mask a
query attends only to earlier keys, so with contiguous blocks rank p−1 has p blocks of work
and rank 0 one. The zig-zag layout (Llama 3, Dubey et al. 2024, §3.3.2: "the i-th CP rank
receives both the i-th and the (2×CP−1−i)-th chunks"; zhuzilin/ring-flash-attention's
``zigzag_ring_flash_attn``; PyTorch's context parallel calls it ``_HeadTailLoadBalancer``) cuts
the sequence into 2p chunks and gives rank i chunks i and 2p−1−i: an early and a late one, the
same work on every rank. (Striped Attention, Brandon et al. 2023, balances by dealing single
tokens round-robin instead.)

A layout is data: :func:`chunks_of` lists the chunks a rank holds, :func:`block_kind` says what
one (query chunk, key chunk) pair needs — the whole block, its causal diagonal, or nothing —
and :func:`work_per_rank` counts the blocks each rank computes (plain arithmetic).
"""

from __future__ import annotations

import torch

__all__ = [
    "LAYOUTS",
    "block_kind",
    "chunks_of",
    "n_chunks",
    "positions",
    "shard_sequence",
    "unshard_sequence",
    "work_per_rank",
]

LAYOUTS = ("contiguous", "zigzag")


def n_chunks(world_size: int, layout: str) -> int:
    """How many equal chunks the sequence is cut into: p (contiguous) or 2p (zig-zag).

    Args:
        world_size: p, context-parallel ranks.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Returns:
        int: the number of chunks.

    Raises:
        ValueError: an unknown layout or p < 1.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return world_size if layout == "contiguous" else 2 * world_size


def chunks_of(rank: int, world_size: int, layout: str) -> list[int]:
    """The chunks rank ``rank`` holds, in the order they are concatenated on it.

    Args:
        rank: the context-parallel rank.
        world_size: p.
        layout: ``"contiguous"`` (chunk ``rank``) or ``"zigzag"`` (chunks rank, 2p−1−rank).

    Returns:
        list[int]: chunk indices (chunk c covers tokens ``[c·s/n, (c+1)·s/n)``).

    Raises:
        ValueError: an unknown layout, or a rank outside ``[0, p)``.
    """
    n = n_chunks(world_size, layout)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside [0, {world_size})")
    return [rank] if layout == "contiguous" else [rank, n - 1 - rank]


def block_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    """What attention of query chunk ``q_chunk`` over key chunk ``k_chunk`` needs.

    Args:
        q_chunk: the queries' chunk index.
        k_chunk: the keys' chunk index (chunks of one layout have one size).
        causal: the causal mask (a query sees keys at or before its position).

    Returns:
        str: ``"full"`` (every key), ``"diagonal"`` (the same chunk: the lower triangle) or
        ``"skip"`` (every key is later: nothing to compute).
    """
    if not causal or q_chunk > k_chunk:
        return "full"
    return "diagonal" if q_chunk == k_chunk else "skip"


def work_per_rank(world_size: int, layout: str, causal: bool = True) -> list[float]:
    """Blocks (chunk × chunk score matrices) each rank computes over a whole ring pass.

    A diagonal block counts ½ (half its scores are masked). Contiguous causal: rank r computes
    r + ½ blocks of (s/p)² scores, from ½ to p − ½; zig-zag: every rank 2p blocks of (s/2p)²
    scores — p/2 of the contiguous size, the mean of the contiguous ranks' work.

    Args:
        world_size: p.
        layout: ``"contiguous"`` or ``"zigzag"``.
        causal: the causal mask.

    Returns:
        list[float]: per rank, in units of one chunk × chunk block.
    """
    weight = {"full": 1.0, "diagonal": 0.5, "skip": 0.0}
    return [
        sum(
            weight[block_kind(qc, kc, causal)]
            for src in range(world_size)
            for qc in chunks_of(rank, world_size, layout)
            for kc in chunks_of(src, world_size, layout)
        )
        for rank in range(world_size)
    ]


def positions(rank: int, world_size: int, seq_len: int, layout: str) -> list[int]:
    """The global token positions rank ``rank`` holds, in its local order.

    Args:
        rank: the context-parallel rank.
        world_size: p.
        seq_len: s, divisible by the number of chunks.
        layout: ``"contiguous"`` or ``"zigzag"``.

    Returns:
        list[int]: s/p positions.

    Raises:
        ValueError: s not divisible by the number of chunks.
    """
    n = n_chunks(world_size, layout)
    if seq_len % n:
        raise ValueError(f"sequence length {seq_len} is not divisible into {n} chunks")
    c = seq_len // n
    return [i for k in chunks_of(rank, world_size, layout) for i in range(k * c, (k + 1) * c)]


def shard_sequence(
    x: torch.Tensor, rank: int, world_size: int, layout: str, dim: int = 2
) -> torch.Tensor:
    """Rank ``rank``'s part of a whole sequence (its chunks, concatenated).

    Args:
        x: the whole tensor, e.g. (B, heads, s, D) with the sequence at ``dim``.
        rank: the context-parallel rank.
        world_size: p.
        layout: ``"contiguous"`` or ``"zigzag"``.
        dim: the sequence dimension (2 for ``scaled_dot_product_attention``'s layout).

    Returns:
        torch.Tensor: s/p positions along ``dim``, contiguous.

    Raises:
        ValueError: s not divisible by the number of chunks.
    """
    n = n_chunks(world_size, layout)
    if x.shape[dim] % n:
        raise ValueError(f"sequence length {x.shape[dim]} is not divisible into {n} chunks")
    parts = x.chunk(n, dim=dim)
    return torch.cat([parts[k] for k in chunks_of(rank, world_size, layout)], dim=dim)


def unshard_sequence(parts: list[torch.Tensor], layout: str, dim: int = 2) -> torch.Tensor:
    """The whole sequence from every rank's part (rank order), undoing :func:`shard_sequence`.

    Args:
        parts: one tensor per rank, as :func:`shard_sequence` made them.
        layout: ``"contiguous"`` or ``"zigzag"``.
        dim: the sequence dimension.

    Returns:
        torch.Tensor: the tokens in their original order.
    """
    p = len(parts)
    chunks: dict[int, torch.Tensor] = {}
    for rank, part in enumerate(parts):
        ids = chunks_of(rank, p, layout)
        for k, piece in zip(ids, part.chunk(len(ids), dim=dim), strict=True):
            chunks[k] = piece
    return torch.cat([chunks[k] for k in range(n_chunks(p, layout))], dim=dim)
