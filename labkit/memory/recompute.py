"""The price of activation recomputation: the FLOPs backward spends rebuilding what it dropped.

Introduced in notebooks/14_activation_recomputation.ipynb.

A transformer block's forward is matrix products: q, k, v and the output projection (4 · 2sbh²),
the MLP (2 · 2sbhf, f = 4h: 16sbh²) and the attention core, QKᵀ and attention-over-V
(2 · 2bs²h) — 24sbh² + 4bs²h FLOPs (Narayanan et al., "Efficient Large-Scale Language Model
Training on GPU Clusters Using Megatron-LM", SC 2021, Appendix). Backward computes two products
per forward product (the gradients of both operands): twice the forward, a step of three
forward-equivalents. Recomputation adds (Korthikanti et al. 2022, §5; Chen et al. 2016):

- ``"full"``: the block's forward once more — a third more than a step without it;
- ``"selective"``: the attention core only, 4bs²h — no weight product at all.

PyTorch's non-reentrant ``torch.utils.checkpoint`` stops recomputing as soon as backward has
every tensor it needs (``early_stop``, its default). A product saves its inputs, and nothing
saves the output of a region's last product, so that product is not run again: full
recomputation of a block skips ``fc2`` (the forward less 2sbhf), selective recomputation of the
core skips attention-over-V (QKᵀ only, 2bs²h). Megatron-LM's reentrant checkpoint reruns the
whole region.

These are the products ``torch.utils.flop_counter.FlopCounterMode`` counts (elementwise work —
softmax, LayerNorm, GELU — it leaves out) on ``labkit.models.TransformerBlock`` with the math
attention (``sdpa_kernel(SDPBackend.MATH)``: bmm products); a fused kernel's backward also
recomputes QKᵀ (2.5 forward-equivalents for the core, not 2). Pure arithmetic, no torch.
"""

from __future__ import annotations

from labkit.memory.block_activations import RECOMPUTE_MODES

__all__ = ["block_flops"]


def block_flops(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    *,
    ffn_hidden: int | None = None,
    recompute: str = "none",
    early_stop: bool = True,
) -> dict[str, int]:
    """Matrix-product FLOPs of one transformer block's training step, by phase.

    Args:
        seq_len: s.
        micro_batch: b.
        hidden: h (the heads do not change the count: a·(s²·h/a) = s²h).
        ffn_hidden: f, the MLP's inner width (None: 4h).
        recompute: ``"none"``, ``"selective"`` (the attention core again) or ``"full"``
            (the forward again).
        early_stop: the recomputed region's last product is not run again (``fc2`` for
            ``"full"``, attention-over-V for ``"selective"``), as non-reentrant
            ``torch.utils.checkpoint`` does by default.

    Returns:
        dict[str, int]: ``"forward"``, ``"backward"`` (2 × forward) and ``"recompute"``, and
        ``"attention core"`` (4bs²h, part of the forward) for reference.

    Raises:
        ValueError: a size < 1 or an unknown ``recompute``.
    """
    f = 4 * hidden if ffn_hidden is None else ffn_hidden
    for name, v in (("seq_len", seq_len), ("micro_batch", micro_batch), ("hidden", hidden),
                    ("ffn_hidden", f)):  # fmt: skip
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    s, b, h = seq_len, micro_batch, hidden
    tokens = s * b
    fc2 = 2 * tokens * f * h
    core = 4 * b * s * s * h  # QKᵀ and attention-over-V, every head
    forward = 4 * 2 * tokens * h * h + 2 * tokens * h * f + fc2 + core
    again = {
        "none": 0,
        "selective": core // 2 if early_stop else core,  # QKᵀ; attention-over-V is the last
        "full": forward - fc2 if early_stop else forward,
    }
    return {
        "forward": forward,
        "backward": 2 * forward,
        "recompute": again[recompute],
        "attention core": core,
    }
