"""The planner's recompute option: what each activation-recomputation mode costs and saves.

Introduced in notebooks/14_activation_recomputation.ipynb, through ``labkit.planner.plan(...,
recompute=("none", "selective", "full"))``; ``labkit.plan_estimates`` adds these terms to its
memory and time. Pure arithmetic, no torch.

- memory: Korthikanti et al. 2022's activation bytes per layer under the mode
  (``labkit.memory.activation_bytes_per_layer``: sbh(34 + 5as/h), sbh·34 selective, 2sbh
  full, at 16 bits, with t = tp), plus, when something is recomputed, what one layer rebuilds
  during its own backward — recomputation runs one layer (one micro-batch) at a time, so the
  peak is what every layer keeps plus one layer's rebuilt tensors (Chen et al., "Training Deep
  Nets with Sublinear Memory Cost", 2016: the kept checkpoints plus one segment recomputed);
- compute: full recomputation runs the forward again, 2Ψ FLOPs per token (a step of 6Ψ
  becomes 8Ψ: Narayanan et al. 2021, Appendix); selective recomputes the attention core of
  every layer, QKᵀ and attention-over-V, 4bs²h per layer and micro-batch (Korthikanti et al.
  2022, §5) — 4·B·s²·h·L per step. Both are upper bounds for PyTorch's non-reentrant
  checkpoint, which does not rerun a region's last product (``labkit.memory.block_flops``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.memory import RECOMPUTE_MODES, activation_bytes_per_layer

if TYPE_CHECKING:
    from labkit.plan_specs import ModelSpec

__all__ = [
    "RECOMPUTE_MODES",
    "recompute_activation_bytes",
    "recompute_flops",
    "recompute_label",
    "recompute_reason",
]


def recompute_label(mode: str) -> str:
    """The suffix of a plan's label: ``""`` for ``"none"``, else ``"·ac-full"`` etc."""
    return "" if mode == "none" else f"·ac-{mode}"


def recompute_activation_bytes(
    model: ModelSpec, microbatch: int, tp: int, mode: str, element_bytes: int
) -> tuple[float, float]:
    """Activation bytes per layer kept for backward, and the bytes one layer rebuilds.

    Args:
        model: the model (s, h, a from it).
        microbatch: b, sequences per micro-batch.
        tp: the tensor-parallel degree t.
        mode: ``"none"``, ``"selective"`` or ``"full"``.
        element_bytes: bytes of an activation (Korthikanti counts 2).

    Returns:
        ``(kept per layer, rebuilt by one layer's backward)`` in bytes; rebuilt is 0 for
        ``"none"``, else the layer's activations without recomputation less what it keeps.

    Raises:
        ValueError: an unknown mode.
    """
    args = (model.seq_len, microbatch, model.hidden, model.n_heads)
    scale = element_bytes / 2  # Korthikanti et al. count 16-bit activations
    kept = activation_bytes_per_layer(*args, tensor_parallel=tp, recompute=mode) * scale
    whole = activation_bytes_per_layer(*args, tensor_parallel=tp) * scale
    return kept, whole - kept


def recompute_flops(model: ModelSpec, mode: str) -> float:
    """FLOPs a step spends recomputing activations, over every device together.

    Args:
        model: the model and its global batch B.
        mode: ``"none"`` (0), ``"selective"`` (4·B·s²·h·L: the attention cores) or ``"full"``
            (2Ψ·B·s: one more forward).

    Returns:
        The FLOPs per optimizer step.

    Raises:
        ValueError: an unknown mode.
    """
    if mode not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {mode!r}")
    tokens = model.batch * model.seq_len
    if mode == "full":
        return 2 * model.n_params * tokens
    if mode == "selective":
        return 4 * tokens * model.seq_len * model.hidden * model.n_layers
    return 0.0


def recompute_reason(mode: str, seconds: float) -> str:
    """The planner's reasons line for the recompute time of ``mode``."""
    how = "2·Ψ·B·s, one more forward" if mode == "full" else "4·B·s²·h·L, the attention cores"
    return f"recompute ({mode}): {how} / (devices·FLOP/s) = {seconds:.4g} s"
