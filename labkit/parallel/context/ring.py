"""Ring attention: attention over a sequence sharded across ranks, K/V blocks passed round a ring.

Introduced in notebooks/16_context_parallel.ipynb.

Liu, Zaharia and Abbeel 2023, "Ring Attention with Blockwise Transformers for Near-Infinite
Context", §3: each of p ranks holds s/p of the queries, keys and values (a ``layout``). In p
steps every rank folds every key/value block into its queries' online softmax
(``online_softmax``): at step i rank r holds the block of rank r−i, starts sending it to r+1
and receiving r−i−1's from r−1 — one ``batch_isend_irecv`` (safe on NCCL, which would
deadlock on separate blocking sends) — and computes while the next block travels. Forward,
per rank: p−1 steps, each sending its K and V blocks (2 messages of b·(s/p)·h elements).

Backward is a custom ``autograd.Function``, as in ring-flash-attention (zhuzilin) and PyTorch's
``_templated_ring_attention_backward``: the K/V blocks go round the ring again (p−1 steps), and
each block's gradient accumulator dK, dV (fp32) travels *with* it, each rank adding its
queries' contribution; after p hops (p messages of each) the accumulators are home. Per rank:
2(p−1) K/V messages and 2p dK/dV messages. It keeps for backward only its own q, k, v, the
output and one fp32 log-sum-exp per query — 4·b·(s/p)·h elements plus b·a·s/p — and rebuilds
each probability block from the log-sum-exp: never the s×s scores, nor the other ranks' K/V.
(Differentiating through the loop with autograd instead would keep every received K/V block
and every step's (s/p)² probabilities: the whole K and V and s²/p scores per rank.)
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from labkit.collectives.counting import P2P
from labkit.parallel.context.layout import block_kind, chunks_of
from labkit.parallel.context.online_softmax import (
    attention_block,
    attention_block_backward,
    merge_blocks,
)

__all__ = ["ring_attention"]


class _Ring:
    """This rank's place in the ring and its chunk bookkeeping."""

    def __init__(self, group: dist.ProcessGroup | None, layout: str, causal: bool) -> None:
        self.p2p = P2P(group)
        self.rank, self.size = self.p2p.rank, self.p2p.world_size
        self.next, self.prev = (self.rank + 1) % self.size, (self.rank - 1) % self.size
        self.layout, self.causal = layout, causal
        self.mine = chunks_of(self.rank, self.size, layout)

    def pairs(self, step: int) -> list[tuple[int, int, str]]:
        """(my chunk, held chunk, kind) for the K/V block held at ``step``, skips left out."""
        held = chunks_of((self.rank - step) % self.size, self.size, self.layout)
        return [
            (i, j, kind)
            for i, qc in enumerate(self.mine)
            for j, kc in enumerate(held)
            if (kind := block_kind(qc, kc, self.causal)) != "skip"
        ]

    def start(self, phase: str, step: int, tensors: list[torch.Tensor]):
        """Send ``tensors`` to the next rank, receive as many from the previous (in flight)."""
        bufs = [torch.empty_like(t) for t in tensors]
        self.p2p.at(phase, step)
        works = self.p2p.start([(t, self.next) for t in tensors], [(b, self.prev) for b in bufs])

        def finish() -> list[torch.Tensor]:
            for w in works:
                w.wait()
            return bufs

        return finish


def _split(t: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(t.chunk(n, dim=2))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, layout: str, causal: bool, scale: float):
        ring = _Ring(group, layout, causal)
        n = len(ring.mine)
        qs = _split(q, n)
        outs: list = [None] * n
        lses: list = [None] * n
        kv = [k.contiguous(), v.contiguous()]
        for step in range(ring.size):
            arriving = ring.start("kv", step, kv) if step < ring.size - 1 else None
            ks, vs = _split(kv[0], n), _split(kv[1], n)
            for i, j, kind in ring.pairs(step):  # computed while the next block travels
                o, lse = attention_block(qs[i], ks[j], vs[j], scale, kind)
                outs[i], lses[i] = merge_blocks(outs[i], lses[i], o, lse)
            if arriving is not None:
                kv = arriving()
        out = torch.cat(outs, dim=2).to(q.dtype)
        lse = torch.cat(lses, dim=2)  # (B, A, s/p), fp32
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.layout, ctx.causal, ctx.scale = group, layout, causal, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        ring = _Ring(ctx.group, ctx.layout, ctx.causal)
        n = len(ring.mine)
        delta = (dout.float() * out.float()).sum(-1)  # Δ = rowsum(dO ∘ O), (B, A, s/p)
        qs, dos, lses, deltas = (_split(t, n) for t in (q, dout, lse, delta))  # dim 2: tokens
        acc_dtype = torch.promote_types(q.dtype, torch.float32)  # fp32 (fp64 for fp64)
        dqs = [torch.zeros_like(t, dtype=acc_dtype) for t in qs]
        kv, acc = [k.contiguous(), v.contiguous()], None
        for step in range(ring.size):
            arriving = ring.start("kv (backward)", step, kv) if step < ring.size - 1 else None
            ks, vs = _split(kv[0], n), _split(kv[1], n)
            dk = torch.zeros_like(kv[0], dtype=acc_dtype)
            dv = torch.zeros_like(kv[1], dtype=acc_dtype)
            dks, dvs = _split(dk, n), _split(dv, n)  # views: += writes into dk, dv
            for i, j, kind in ring.pairs(step):
                dq_, dk_, dv_ = attention_block_backward(
                    qs[i], ks[j], vs[j], dos[i], lses[i], deltas[i], ctx.scale, kind
                )
                dqs[i] += dq_
                dks[j] += dk_
                dvs[j] += dv_
            if acc is not None:  # the accumulators of this block, from the ranks before us
                dk, dv = dk + acc[0], dv + acc[1]
            acc = ring.start("dkv", step, [dk, dv])() if ring.size > 1 else [dk, dv]
            if arriving is not None:
                kv = arriving()
        dq = torch.cat(dqs, dim=2)
        return dq.to(q.dtype), acc[0].to(k.dtype), acc[1].to(v.dtype), None, None, None, None


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    causal: bool = True,
    layout: str = "zigzag",
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of this rank's queries over the whole sharded sequence, by ring attention.

    Liu et al. 2023, §3, with the online softmax (Milakov and Gimelshein 2018) and the
    zig-zag layout (Llama 3, Dubey et al. 2024, §3.3.2). Equal to
    ``scaled_dot_product_attention`` of the whole q, k, v, restricted to this rank's tokens.
    Messages go through ``labkit.collectives.P2P``: count them with
    ``labkit.collectives.count_messages()`` (phases ``"kv"``, ``"kv (backward)"``, ``"dkv"``).

    Args:
        q, k, v: (B, heads, s/p, D), this rank's tokens as ``layout.shard_sequence`` cuts them,
            on this rank's device.
        group: the context-parallel group (None: the default group).
        causal: the causal mask over the *global* positions.
        layout: ``"zigzag"`` (chunks r and 2p−1−r) or ``"contiguous"`` (chunk r).
        scale: the scores' factor (None: 1/√D).

    Returns:
        torch.Tensor: (B, heads, s/p, D), this rank's rows of the attention output.

    Raises:
        ValueError: an unknown layout, or s/p not divisible into this rank's chunks.
    """
    n = len(chunks_of(dist.get_rank(group), dist.get_world_size(group), layout))
    if q.shape[2] % n or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"q and k must hold the same {n} equal chunks of the sequence; got {q.shape[2]} "
            f"and {k.shape[2]} positions"
        )
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _RingAttention.apply(q, k, v, group, layout, causal, scale)
