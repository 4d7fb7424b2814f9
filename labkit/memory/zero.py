"""ZeRO's per-device model states in closed form (Rajbhandari et al. 2020, §5, Figure 1, Table 1).

Introduced in notebooks/13_zero_and_fsdp.ipynb.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ADAM_MIXED_K",
    "DP_DEGREES",
    "GB",
    "MODEL_SIZES",
    "STAGES",
    "STAGE_NAMES",
    "MemoryBreakdown",
    "check_dp",
    "check_stage",
    "per_device_bytes",
    "table",
    "zero_memory",
]

GB = 1e9  # bytes per GB, as the ZeRO paper counts (7.5B × 16 bytes = 120 GB)
ADAM_MIXED_K = 12  # fp32 master weights + momentum + variance: 4 + 4 + 4 bytes per parameter
STAGES = (0, 1, 2, 3)
STAGE_NAMES = {0: "baseline DP", 1: "P_os", 2: "P_os+g", 3: "P_os+g+p"}
# 1.5B (GPT-2), 7.5B (the paper's worked example), 13B (the largest it trains without model
# parallelism), 128B and 1T (its Table 1).
MODEL_SIZES = (1.5e9, 7.5e9, 13e9, 128e9, 1e12)
DP_DEGREES = (1, 4, 16, 64, 256, 1024)  # the DP degrees of the paper's Table 1


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of model state one data-parallel rank holds, split by kind."""

    stage: int
    n_params: float
    dp_degree: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        """Parameters + gradients + optimizer states, in bytes."""
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes

    @property
    def total_gb(self) -> float:
        """The total in GB (10⁹ bytes), the unit of the ZeRO paper."""
        return self.total_bytes / GB

    def as_gb(self) -> dict[str, float]:
        """``{"params", "grads", "optimizer", "total"}`` in GB (10⁹ bytes)."""
        return {
            "params": self.params_bytes / GB,
            "grads": self.grads_bytes / GB,
            "optimizer": self.optimizer_bytes / GB,
            "total": self.total_gb,
        }


def check_stage(stage: Any) -> int:
    """``stage`` as an int of ``STAGES``; ValueError otherwise."""
    if isinstance(stage, bool) or stage not in STAGES:
        raise ValueError(
            f"stage must be one of {STAGES} (0 = plain data parallelism), got {stage!r}"
        )
    return int(stage)


def check_dp(dp_degree: Any) -> int:
    """``dp_degree`` if it is an int >= 1; ValueError otherwise."""
    if isinstance(dp_degree, bool) or not isinstance(dp_degree, int) or dp_degree < 1:
        raise ValueError(f"dp_degree must be an int >= 1, got {dp_degree!r}")
    return dp_degree


def _check_nonneg(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    return float(value)


def zero_memory(
    n_params: float,
    dp_degree: int,
    stage: int,
    *,
    param_bytes: float = 2,
    grad_bytes: float = 2,
    optimizer_bytes: float = ADAM_MIXED_K,
) -> MemoryBreakdown:
    """Per-device bytes of parameters, gradients and optimizer states under ZeRO stage ``stage``.

    ZeRO, Rajbhandari et al. 2020, §5 and Figure 1: with Ψ = ``n_params``, N_d =
    ``dp_degree`` and K = ``optimizer_bytes``, stage 0 holds (2 + 2 + K)Ψ, stage 1
    2Ψ + 2Ψ + KΨ/N_d, stage 2 2Ψ + (2 + K)Ψ/N_d, stage 3 (2 + 2 + K)Ψ/N_d (with 2 and 2 the
    bytes of fp16 parameters and gradients). Shards are exact fractions here (the paper's
    arithmetic); ``zero_rank_bytes`` rounds real tensors up to whole padded shards.

    Args:
        n_params: Ψ, the number of parameters (> 0).
        dp_degree: N_d, the number of data-parallel ranks sharing the states.
        stage: 0 (baseline data parallelism), 1 (P_os), 2 (P_os+g) or 3 (P_os+g+p).
        param_bytes: bytes per parameter as held for forward/backward (2: fp16).
        grad_bytes: bytes per gradient (2: fp16).
        optimizer_bytes: K, optimizer-state bytes per parameter (12: mixed-precision Adam).

    Returns:
        The ``MemoryBreakdown`` of one rank.

    Raises:
        ValueError: ``n_params`` not > 0, ``dp_degree`` not an int >= 1, an unknown stage,
            or negative byte counts.
    """
    psi = _check_nonneg("n_params", n_params)
    if psi <= 0:
        raise ValueError(f"n_params must be > 0, got {n_params!r}")
    nd = check_dp(dp_degree)
    stage = check_stage(stage)
    pb = _check_nonneg("param_bytes", param_bytes)
    gb = _check_nonneg("grad_bytes", grad_bytes)
    k = _check_nonneg("optimizer_bytes", optimizer_bytes)
    params = pb * psi / (nd if stage >= 3 else 1)
    grads = gb * psi / (nd if stage >= 2 else 1)
    optim = k * psi / (nd if stage >= 1 else 1)
    return MemoryBreakdown(stage, psi, nd, params, grads, optim)


def per_device_bytes(
    n_params: float, dp_degree: int, stage: int, optimizer_bytes: float = ADAM_MIXED_K
) -> float:
    """Total model-state bytes per device under ZeRO ``stage`` (mixed-precision Adam by default).

    The closed forms of ZeRO (Rajbhandari et al. 2020, Figure 1); see ``zero_memory``.

    Args:
        n_params: Ψ, the number of parameters.
        dp_degree: N_d, the data-parallel degree.
        stage: 0, 1, 2 or 3.
        optimizer_bytes: K (12 for mixed-precision Adam).

    Returns:
        Bytes per device.

    Raises:
        ValueError: as ``zero_memory``.
    """
    return zero_memory(n_params, dp_degree, stage, optimizer_bytes=optimizer_bytes).total_bytes


def table(
    model_sizes: Iterable[float] = MODEL_SIZES,
    dp_degrees: Iterable[int] = DP_DEGREES,
    stages: Iterable[int] = STAGES,
    optimizer_bytes: float = ADAM_MIXED_K,
) -> list[dict[str, float | int | str]]:
    """Per-device memory for every model size × DP degree × stage, as plain rows.

    Extends Table 1 of ZeRO (Rajbhandari et al. 2020: 7.5B, 128B and 1T parameters at DP 1 to
    1024 for P_os, P_os+g, P_os+g+p) with 1.5B and 13B and with the baseline (stage 0).

    Args:
        model_sizes: parameter counts Ψ (default ``MODEL_SIZES``, 1.5B to 1T).
        dp_degrees: data-parallel degrees (default ``DP_DEGREES``, 1 to 1024).
        stages: ZeRO stages (default all four).
        optimizer_bytes: K (12 for mixed-precision Adam).

    Returns:
        One dict per (model size, DP degree, stage) in that nesting order: ``{"n_params",
        "dp_degree", "stage", "stage_name", "params_gb", "grads_gb", "optimizer_gb",
        "total_gb"}`` (GB = 10⁹ bytes).

    Raises:
        ValueError: as ``zero_memory``.
    """
    rows: list[dict[str, float | int | str]] = []
    for psi in model_sizes:
        for nd in dp_degrees:
            for stage in stages:
                gb = zero_memory(psi, nd, stage, optimizer_bytes=optimizer_bytes).as_gb()
                rows.append(
                    {
                        "n_params": psi,
                        "dp_degree": nd,
                        "stage": stage,
                        "stage_name": STAGE_NAMES[stage],
                        "params_gb": gb["params"],
                        "grads_gb": gb["grads"],
                        "optimizer_gb": gb["optimizer"],
                        "total_gb": gb["total"],
                    }
                )
    return rows
