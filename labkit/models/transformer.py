"""A transformer's parts: MLP, multi-head self-attention and a pre-norm block.

Introduced in notebooks/12_tensor_parallel.ipynb.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.models._seed import seeded as _seeded

__all__ = ["FeedForward", "SelfAttention", "TransformerBlock"]


class FeedForward(nn.Module):
    """A transformer's MLP: ``fc1`` (h → hidden) → GELU → ``fc2`` (hidden → h).

    The block Megatron-LM splits first (Shoeybi et al. 2019, §3, Figure 3a).

    Args:
        dim: model width h.
        hidden: inner width (4h in GPT-2).
        seed: initialisation seed (same weights on every process).
    """

    def __init__(self, dim: int = 16, hidden: int = 64, seed: int | None = 0) -> None:
        super().__init__()
        with _seeded(seed):
            self.fc1 = nn.Linear(dim, hidden)
            self.act = nn.GELU()
            self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate ``q``, ``k``, ``v`` and output ``proj`` layers.

    The number of heads is read from the width of ``q``'s output (``width // head_dim``), so the
    same code runs a tensor-parallel shard that holds only some of the heads (Shoeybi et al. 2019,
    §3, Figure 3b).

    Args:
        dim: model width h (a multiple of ``n_heads``).
        n_heads: attention heads.
        causal: mask future positions (a decoder, as in GPT).
        seed: initialisation seed.

    Raises:
        ValueError: ``dim`` not divisible by ``n_heads``.
    """

    def __init__(
        self, dim: int = 16, n_heads: int = 4, causal: bool = True, seed: int | None = 0
    ) -> None:
        super().__init__()
        if dim % n_heads:
            raise ValueError(f"dim {dim} is not divisible by n_heads {n_heads}")
        self.n_heads, self.head_dim, self.causal = n_heads, dim // n_heads, causal
        with _seeded(seed):
            self.q, self.k, self.v = (nn.Linear(dim, dim) for _ in range(3))
            self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape  # batch, time, channels

        def heads(t: torch.Tensor) -> torch.Tensor:  # (B, T, H·D) → (B, H, T, D)
            return t.view(B, T, -1, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        y = self.core(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))

    def core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attention core softmax(QKᵀ/√d)·V, (B, H, T, D) each: no parameters.

        What selective recomputation rebuilds in backward (Korthikanti et al. 2022, §5;
        ``labkit.parallel.compose.apply_ac(..., mode="selective")`` checkpoints this method).
        """
        return nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``+ mlp(ln2(x))``.

    Args:
        dim: model width h.
        n_heads: attention heads.
        hidden: MLP inner width (default 4h).
        causal: causal attention.
        seed: initialisation seed.
    """

    def __init__(
        self,
        dim: int = 16,
        n_heads: int = 4,
        hidden: int | None = None,
        causal: bool = True,
        seed: int | None = 0,
    ) -> None:
        super().__init__()
        with _seeded(seed):
            self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, n_heads, causal, seed=None if seed is None else seed + 1)
        self.mlp = FeedForward(dim, hidden or 4 * dim, seed=None if seed is None else seed + 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))
