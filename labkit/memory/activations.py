"""Activation memory of a transformer layer (Korthikanti et al. 2022, Table 2).

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

__all__ = ["activation_bytes_per_layer"]


def activation_bytes_per_layer(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    n_heads: int,
    *,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> float:
    """Activation bytes one transformer layer stores for backward (16-bit activations).

    Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022,
    §4 and Table 2, with s = ``seq_len``, b = ``micro_batch``, h = ``hidden``, a =
    ``n_heads``, t = ``tensor_parallel``:

    - no parallelism: sbh(34 + 5as/h);
    - tensor parallel: sbh(10 + 24/t + 5as/(ht));
    - tensor + sequence parallel: sbh(34/t + 5as/(ht));
    - selective recompute (the attention's softmax, dropout and QKᵀ are recomputed, so the
      5as/h term goes): sbh(10 + 24/t), or sbh·34/t with sequence parallelism;
    - full recompute (only each layer's input is kept): 2sbh (2sbh/t with sequence
      parallelism).

    Args:
        seq_len: s, tokens per sequence.
        micro_batch: b, sequences per micro-batch.
        hidden: h, the hidden size.
        n_heads: a, attention heads.
        tensor_parallel: t, the tensor-parallel degree (1: none).
        sequence_parallel: shard LayerNorm/dropout activations over the t ranks as well.
        recompute: ``"none"``, ``"selective"`` or ``"full"``.

    Returns:
        Bytes per layer on one device.

    Raises:
        ValueError: non-positive sizes, or an unknown ``recompute``.
    """
    for name, v in (
        ("seq_len", seq_len),
        ("micro_batch", micro_batch),
        ("hidden", hidden),
        ("n_heads", n_heads),
        ("tensor_parallel", tensor_parallel),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if recompute not in ("none", "selective", "full"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    s, b, h, a, t = seq_len, micro_batch, hidden, n_heads, tensor_parallel
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (t if sequence_parallel else 1)
    attention = 0.0 if recompute == "selective" else 5 * a * s / (h * t)
    linear = 34 / t if sequence_parallel else 10 + 24 / t
    return sbh * (linear + attention)
