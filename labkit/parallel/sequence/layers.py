"""Sequence-parallel attention and MLP: all-gather into the column GEMMs, reduce-scatter out.

Introduced in notebooks/15_sequence_parallel.ipynb.

Korthikanti et al. 2022, §4.2.2, Figure 5. Each module takes this rank's tokens (B, T/p, h)
and returns them: the input is all-gathered (``g``) into the column-parallel GEMMs (q, k, v;
``fc1``), the heads or the MLP's inner columns are this rank's as in tensor parallelism, and
the row-parallel GEMM's partial sums are reduce-scattered (``ḡ``) before its bias, which is
therefore added on this rank's tokens only. Its gradient and the LayerNorms' (applied to
each rank's tokens) are partial sums over the tensor-parallel ranks: see
``labkit.parallel.sequence.apply.reduce_sequence_parallel_grads``.

What backward keeps (§4.2.2, last paragraph): the column GEMMs need the *gathered* input to
compute their weight gradients. Saving it would keep a whole (B, T, h) tensor per GEMM input;
Megatron-LM instead keeps this rank's (B, T/p, h) slice and all-gathers it again in backward,
overlapped with the input-gradient GEMM (its ``LinearWithGradAccumulationAndAsyncCommunication``).
``regather=True`` does that: one more all-gather per region in backward, 1/p of the memory.
``regather=False`` keeps the gathered tensor, as autograd through ``gather_from_sequence`` and
DTensor's ``ColwiseParallel(input_layouts=Shard(1))`` do.

The weights are held by ``labkit.parallel.tensor``'s ``ColumnParallelLinear`` /
``RowParallelLinear`` (same rows and columns, same names as the unsplit model), whose own
``forward`` (with Megatron's all-reduces) these modules do not call.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.parallel.sequence.comm import (
    reduce_scatter_to_sequence,
    start_all_gather_sequence,
    start_reduce_scatter_sequence,
)
from labkit.parallel.tensor import ColumnParallelLinear, RowParallelLinear

__all__ = ["SequenceParallelAttention", "SequenceParallelMLP", "gather_linears"]


class _GatherLinears(torch.autograd.Function):
    """All-gather x, then one column GEMM per weight; keep x's shard (regather) or the gather."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group, regather: bool, *params: torch.Tensor | None):
        full = start_all_gather_sequence(x, group)()  # (B, T, h)
        weights, biases = params[0::2], params[1::2]
        ctx.group, ctx.regather = group, regather
        ctx.has_bias = [b is not None for b in biases]
        ctx.save_for_backward(x if regather else full, *weights)
        return tuple(F.linear(full, w, b) for w, b in zip(weights, biases, strict=True))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        kept, *weights = ctx.saved_tensors
        gathered = start_all_gather_sequence(kept, ctx.group) if ctx.regather else lambda: kept
        # dgrad while the input is being gathered again (Megatron overlaps the two)
        grad_full = sum(g @ w for g, w in zip(grads, weights, strict=True))  # (B, T, h)
        reduced = start_reduce_scatter_sequence(grad_full, ctx.group)  # ... and wgrad with this
        full = gathered().reshape(-1, kept.shape[-1])  # (B·T, h)
        out: list[torch.Tensor | None] = []
        for g, has_bias in zip(grads, ctx.has_bias, strict=True):
            g2 = g.reshape(-1, g.shape[-1])  # (B·T, out/p)
            out += [g2.t() @ full, g2.sum(0) if has_bias else None]
        return (reduced(), None, None, *out)


def gather_linears(
    x: torch.Tensor,
    layers: list[ColumnParallelLinear],
    group: dist.ProcessGroup | None = None,
    regather: bool = True,
) -> tuple[torch.Tensor, ...]:
    """``g`` then the column-parallel GEMMs that read its output, as one autograd function.

    Korthikanti et al. 2022, §4.2.2: forward all-gathers this rank's tokens once for every
    layer (q, k and v share it); backward reduce-scatters the summed input gradient, and with
    ``regather`` all-gathers the input again instead of having kept it.

    Args:
        x: (B, T/p, h), this rank's tokens.
        layers: column-parallel layers (their ``weight`` (out/p, h) and ``bias``).
        group: the tensor-parallel group (None: the default group).
        regather: keep x (1/p of the sequence) for backward and all-gather it again there;
            False keeps the gathered (B, T, h) tensor and saves that all-gather.

    Returns:
        tuple[torch.Tensor, ...]: one (B, T, out/p) output per layer.
    """
    params = [t for layer in layers for t in (layer.weight, layer.bias)]
    return _GatherLinears.apply(x, group, regather, *params)


def _row_output(y: torch.Tensor, row: RowParallelLinear, group) -> torch.Tensor:
    """ḡ on the row GEMM's partial sums, then the bias on this rank's tokens."""
    y = reduce_scatter_to_sequence(F.linear(y, row.weight), group)  # (B, T/p, h)
    return y if row.bias is None else y + row.bias


class SequenceParallelAttention(nn.Module):
    """A ``SelfAttention`` on this rank's tokens: heads split, sequence gathered in between.

    Args:
        attn: the unsplit attention (``n_heads``, ``head_dim``, ``causal``, ``q``, ``k``,
            ``v``, ``proj``); its weights are copied (sliced), it is left unchanged.
        group: the tensor-parallel group (None: the default group).
        regather: all-gather the input again in backward instead of keeping it (Megatron).

    Raises:
        ValueError: ``n_heads`` not divisible by the group size.
    """

    def __init__(
        self, attn: nn.Module, group: dist.ProcessGroup | None = None, regather: bool = True
    ) -> None:
        super().__init__()
        p = dist.get_world_size(group)
        if attn.n_heads % p:
            raise ValueError(f"{attn.n_heads} heads cannot be split over {p} ranks")
        self.group, self.regather = group, regather
        self.n_heads, self.head_dim, self.causal = attn.n_heads // p, attn.head_dim, attn.causal
        self.q, self.k, self.v = (ColumnParallelLinear(getattr(attn, n), group) for n in "qkv")
        self.proj = RowParallelLinear(attn.proj, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = gather_linears(x, [self.q, self.k, self.v], self.group, self.regather)
        B, T, _ = q.shape  # batch, whole sequence, this rank's heads × head_dim

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, H/p·D) → (B, H/p, T, D)
            return t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=self.causal)
        return _row_output(y.transpose(1, 2).reshape(B, T, -1), self.proj, self.group)

    def extra_repr(self) -> str:
        return f"heads={self.n_heads} per rank, regather={self.regather}"


class SequenceParallelMLP(nn.Module):
    """A ``FeedForward`` on this rank's tokens: ``g`` → fc1 (columns) → act → fc2 (rows) → ``ḡ``.

    Args:
        mlp: the unsplit MLP (``fc1``, ``act``, ``fc2``), left unchanged.
        group: the tensor-parallel group (None: the default group).
        regather: all-gather the input again in backward instead of keeping it (Megatron).

    Raises:
        ValueError: the inner width not divisible by the group size.
    """

    def __init__(
        self, mlp: nn.Module, group: dist.ProcessGroup | None = None, regather: bool = True
    ) -> None:
        super().__init__()
        self.group, self.regather = group, regather
        self.fc1 = ColumnParallelLinear(mlp.fc1, group)
        self.act = mlp.act
        self.fc2 = RowParallelLinear(mlp.fc2, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        (u,) = gather_linears(x, [self.fc1], self.group, self.regather)  # (B, T, hidden/p)
        return _row_output(self.act(u), self.fc2, self.group)

    def extra_repr(self) -> str:
        return f"regather={self.regather}"
