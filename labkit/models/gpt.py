"""TinyGPT: token and position embeddings, causal transformer blocks, a language-model head.

Introduced in notebooks/21_capstone.ipynb.
"""

from __future__ import annotations

import torch
from torch import nn

from labkit.models._seed import seeded as _seeded
from labkit.models.transformer import TransformerBlock

__all__ = ["TinyGPT", "gpt_parameter_count"]


class _Embedding(nn.Module):
    """Token plus learned position embedding: ids (B, T) → (B, T, h)."""

    def __init__(self, vocab_size: int, dim: int, seq_len: int) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab_size, dim), nn.Embedding(seq_len, dim)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # Ids may arrive as floats: a pipeline stage's receive buffers take the input's dtype.
        T = idx.shape[1]  # time
        return self.tok(idx.long()) + self.pos(torch.arange(T, device=idx.device))


class _Head(nn.Module):
    """Final LayerNorm and the language-model head: (B, T, h) → logits (B, T, vocab)."""

    def __init__(self, vocab_size: int, dim: int) -> None:
        super().__init__()
        self.ln_f, self.lm_head = nn.LayerNorm(dim), nn.Linear(dim, vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


def gpt_parameter_count(
    vocab_size: int, dim: int, n_layers: int, seq_len: int, tie_weights: bool = False
) -> int:
    """Parameters of a ``TinyGPT``: Vh + Th + L(12h² + 13h) + 2h (+ Vh for an untied head).

    Per block: two LayerNorms (4h), q, k, v and the projection (4h² + 4h) and the MLP h → 4h → h
    (8h² + 5h); GPT-2's 12h² per layer (Radford et al. 2019; Kaplan et al. 2020, §2.1, count 12·L·h²
    without biases).

    Args:
        vocab_size: V.
        dim: h.
        n_layers: L.
        seq_len: T, positions embedded.
        tie_weights: the head shares the token embedding's matrix.

    Returns:
        The count.
    """
    V, h, L, T = vocab_size, dim, n_layers, seq_len
    return V * h + T * h + L * (12 * h * h + 13 * h) + 2 * h + (0 if tie_weights else V * h)


class TinyGPT(nn.Sequential):
    """A decoder-only transformer (GPT-2's layout, pre-norm) as a sequence of layers.

    Layer 0 embeds tokens and positions, layers 1..L are causal ``TransformerBlock``s, the last is
    the final LayerNorm and the language-model head (nanoGPT's ``model.py`` in miniature). Being an
    ``nn.Sequential``, it can be cut into pipeline stages by index; its blocks are named ``"1"`` …
    ``"L"`` for a tensor-parallel plan (``lk.parallel.tensor.block_plan``).

    Args:
        vocab_size: V, token ids 0..V-1.
        dim: model width h (a multiple of ``n_heads``).
        n_layers: L transformer blocks.
        n_heads: attention heads per block.
        seq_len: the longest context (positions embedded).
        tie_weights: the head reuses the token embedding (GPT-2 does; off by default, since
            a pipeline or a sharded model would then share a tensor across stages or units).
        seed: initialisation seed (same weights on every process).

    Raises:
        ValueError: a size that is not positive, or ``dim`` not divisible by ``n_heads``.
    """

    def __init__(
        self,
        vocab_size: int,
        dim: int = 64,
        n_layers: int = 4,
        n_heads: int = 4,
        seq_len: int = 64,
        tie_weights: bool = False,
        seed: int | None = 0,
    ) -> None:
        if min(vocab_size, dim, n_layers, n_heads, seq_len) < 1:
            raise ValueError(
                f"sizes must be >= 1, got {vocab_size=}, {dim=}, {n_layers=}, {n_heads=}, "
                f"{seq_len=}"
            )
        if dim % n_heads:
            raise ValueError(f"dim {dim} is not divisible by n_heads {n_heads}")
        with _seeded(seed):
            emb, head = _Embedding(vocab_size, dim, seq_len), _Head(vocab_size, dim)
        blocks = [
            TransformerBlock(dim, n_heads, seed=None if seed is None else seed + 10 * (i + 1))
            for i in range(n_layers)
        ]
        super().__init__(emb, *blocks, head)
        if tie_weights:
            head.lm_head.weight = emb.tok.weight
        self.vocab_size, self.dim, self.n_layers = vocab_size, dim, n_layers
        self.n_heads, self.seq_len = n_heads, seq_len

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) for token ids (B, T), T ≤ ``seq_len``."""
        if idx.shape[1] > self.seq_len:
            raise ValueError(f"sequence of {idx.shape[1]} tokens > seq_len {self.seq_len}")
        return super().forward(idx)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Append ``max_new_tokens`` sampled tokens to ``idx`` (B, T), one at a time.

        Each step feeds the last ``seq_len`` tokens and samples from softmax(logits / τ) at
        the last position (τ = 0: the most likely token).

        Args:
            idx: the prompt's token ids, (B, T) int64.
            max_new_tokens: tokens to add.
            temperature: τ ≥ 0.
            generator: random generator for sampling (reproducible samples).

        Returns:
            (B, T + max_new_tokens) token ids.
        """
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.seq_len :])[:, -1]  # (B, V)
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                probs = torch.softmax(logits / temperature, -1)
                nxt = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, nxt], 1)
        return idx
