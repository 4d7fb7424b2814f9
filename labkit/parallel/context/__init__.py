"""Context parallelism: attention over a sequence sharded across ranks (ring attention).

Introduced in notebooks/16_context_parallel.ipynb.

``layout`` cuts the sequence (contiguous, or zig-zag for a balanced causal mask),
``online_softmax`` computes attention one key block at a time and merges the blocks exactly,
``ring`` passes the key/value blocks around the ring with batched send/recv (and their
gradients back, in a custom backward). The message counts are
``labkit.costmodel.ring_attention_traffic``; the memory ``labkit.memory.attention_saved_bytes``.
"""

from __future__ import annotations

from labkit.parallel.context.layout import (
    LAYOUTS,
    block_kind,
    chunks_of,
    n_chunks,
    positions,
    shard_sequence,
    unshard_sequence,
    work_per_rank,
)
from labkit.parallel.context.online_softmax import (
    attention_block,
    attention_block_backward,
    merge_blocks,
    softmax_attention,
)
from labkit.parallel.context.ring import ring_attention

__all__ = [
    "LAYOUTS",
    "attention_block",
    "attention_block_backward",
    "block_kind",
    "chunks_of",
    "merge_blocks",
    "n_chunks",
    "positions",
    "ring_attention",
    "shard_sequence",
    "softmax_attention",
    "unshard_sequence",
    "work_per_rank",
]
