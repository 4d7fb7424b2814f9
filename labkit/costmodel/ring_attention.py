"""Messages and bytes of ring attention per rank, forward and backward (counts only).

Introduced in notebooks/16_context_parallel.ipynb.

Liu et al. 2023, "Ring Attention", §3: with the sequence on p ranks, each rank's K and V blocks
(b·s/p·h elements each, h = heads × head dim) travel p−1 hops in forward: every rank sends
2(p−1) messages. Backward (ring-flash-attention's, ``labkit.parallel.context.ring``) sends the
K/V blocks round again (2(p−1) messages) and the blocks' gradient accumulators dK, dV with
them, one hop more so that they end at their owner (2p messages, kept in fp32). An all-gather
of K and V (PyTorch's default ``set_rotate_method("allgather")``) receives the same bytes but
holds all of K and V at once instead of two blocks. Pure arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RingTraffic", "ring_attention_traffic"]


@dataclass(frozen=True)
class RingTraffic:
    """What one rank sends in one attention forward and backward (it receives as much).

    Attributes:
        forward_messages, forward_bytes: K and V blocks, p−1 steps.
        backward_messages, backward_bytes: K and V blocks again (p−1 steps) and the dK, dV
            accumulators (p steps).
        block_elements: b·(s/p)·h, the elements of one K (or V, dK, dV) block.
    """

    forward_messages: int
    forward_bytes: int
    backward_messages: int
    backward_bytes: int
    block_elements: int


def ring_attention_traffic(
    world_size: int,
    seq_len: int,
    batch: int,
    hidden: int,
    bytes_per_element: int = 4,
    grad_bytes: int = 4,
) -> RingTraffic:
    """Messages and bytes one rank of ring attention sends per forward and backward.

    Args:
        world_size: p, context-parallel ranks.
        seq_len: s, the whole sequence (divisible by p).
        batch: b.
        hidden: h = heads × head_dim, the width of K and V.
        bytes_per_element: bytes of a K/V element (4: fp32, 2: bf16).
        grad_bytes: bytes of a dK/dV accumulator element (fp32: 4).

    Returns:
        RingTraffic: forward 2(p−1) messages of b·(s/p)·h elements; backward 2(p−1) + 2p
        (0 when p = 1: nothing to send).

    Raises:
        ValueError: non-positive sizes, or s not divisible by p.
    """
    for name, v in (("world_size", world_size), ("seq_len", seq_len), ("batch", batch),
                    ("hidden", hidden), ("bytes_per_element", bytes_per_element),
                    ("grad_bytes", grad_bytes)):  # fmt: skip
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    p = world_size
    if seq_len % p:
        raise ValueError(f"sequence length {seq_len} is not divisible by {p} ranks")
    block = batch * (seq_len // p) * hidden
    kv = 2 * (p - 1)
    dkv = 2 * p if p > 1 else 0
    return RingTraffic(
        forward_messages=kv,
        forward_bytes=kv * block * bytes_per_element,
        backward_messages=kv + dkv,
        backward_bytes=kv * block * bytes_per_element + dkv * block * grad_bytes,
        block_elements=block,
    )
