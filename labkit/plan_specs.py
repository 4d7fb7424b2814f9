"""The planner's inputs: the model and the devices, validated; the error it raises.

Introduced in notebooks/18_hybrid_parallel.ipynb, through ``labkit.planner`` (which
re-exports them). Pure arithmetic, no torch at import.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceSpec", "ModelSpec", "PlanError"]


class PlanError(ValueError):
    """Inputs the planner cannot work with (no devices, a size ≤ 0, an unknown ZeRO stage)."""


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"{name} must be an int >= 1, got {value!r}")
    return value


def _positive(name: str, value: Any) -> float:
    ok = not isinstance(value, bool) and isinstance(value, int | float) and value > 0
    if not ok or not math.isfinite(value):
        raise PlanError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ModelSpec:
    """What the planner needs to know about a transformer-like model and its batch.

    Args:
        n_params: Ψ, the number of parameters.
        n_layers: L, layers (pipeline stages get L/pp each).
        hidden: h, the model width (activations are b·s·h per layer boundary).
        seq_len: s, tokens per sequence.
        batch: B, sequences per optimizer step (the global batch).
        n_heads: attention heads (tensor parallelism splits them).
        bytes_per_param: bytes of a parameter without mixed precision (4: fp32).
        name: a label.

    Raises:
        PlanError: a count < 1 or ``n_params`` ≤ 0.
    """

    n_params: int
    n_layers: int
    hidden: int
    seq_len: int
    batch: int
    n_heads: int = 1
    bytes_per_param: int = 4
    name: str = "model"

    def __post_init__(self) -> None:
        _positive("n_params", self.n_params)
        for name in ("n_layers", "hidden", "seq_len", "batch", "n_heads", "bytes_per_param"):
            _positive_int(name, getattr(self, name))

    @classmethod
    def from_module(
        cls,
        module: Any,
        *,
        n_layers: int,
        hidden: int,
        seq_len: int,
        batch: int,
        n_heads: int = 1,
        name: str | None = None,
    ) -> ModelSpec:
        """The spec of a real ``nn.Module``: Ψ counted from ``module.parameters()``.

        Args:
            module: the model (anything with ``parameters()``).
            n_layers: L.
            hidden: h.
            seq_len: s (1 for a model without a sequence axis).
            batch: B.
            n_heads: attention heads (1 for an MLP).
            name: a label (default: the module's class name).

        Returns:
            The ``ModelSpec``, ``bytes_per_param`` from the first parameter's dtype.

        Raises:
            PlanError: the module has no parameters, or a size < 1.
        """
        params = list(module.parameters())
        if not params:
            raise PlanError("the module has no parameters")
        return cls(
            n_params=sum(p.numel() for p in params),
            n_layers=n_layers,
            hidden=hidden,
            seq_len=seq_len,
            batch=batch,
            n_heads=n_heads,
            bytes_per_param=params[0].element_size(),
            name=name or type(module).__name__,
        )


@dataclass(frozen=True)
class DeviceSpec:
    """The devices: how many, memory and sustained FLOP/s of each.

    Args:
        count: devices (dp·pp·tp must equal it).
        memory_bytes: memory of one device, in bytes.
        flops: sustained FLOP/s of one device (what a training step achieves, not the peak).
        per_node: devices per node, when ``plan`` gets a faster ``intra_node`` network
            (None: all on one network).

    Raises:
        PlanError: a count < 1, or memory or FLOP/s not > 0.
    """

    count: int
    memory_bytes: float
    flops: float
    per_node: int | None = None

    def __post_init__(self) -> None:
        _positive_int("count", self.count)
        _positive("memory_bytes", self.memory_bytes)
        _positive("flops", self.flops)
        if self.per_node is not None:
            _positive_int("per_node", self.per_node)
