"""Bytes a from-scratch ZeRO holds per rank for a real ``nn.Module`` (flat padded shards).

Introduced in notebooks/13_zero_and_fsdp.ipynb.

Pure arithmetic on the module's parameter sizes and dtypes: no processes, and torch is not
imported here (the dtypes' ``itemsize`` give the bytes).
"""

from __future__ import annotations

from typing import Any

from labkit.memory.zero import MemoryBreakdown, check_dp, check_stage

__all__ = ["zero_rank_bytes"]


def _itemsize(dtype: Any) -> int:
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    itemsize = getattr(dtype, "itemsize", None)  # torch.dtype (>= 2.1) and numpy dtypes
    if isinstance(itemsize, int):
        return itemsize
    raise TypeError(f"expected a torch.dtype or a byte count, got {dtype!r}")


def zero_rank_bytes(
    module: Any,
    dp_degree: int,
    stage: int,
    *,
    param_dtype: Any = None,
    grad_dtype: Any = None,
    state_dtype: Any = 4,
    master_weights: bool | None = None,
    padding: str = "flat",
) -> MemoryBreakdown:
    """Bytes one rank of a from-scratch ZeRO holds for the model states of a real ``module``.

    Sharding follows flat-parameter implementations (DeepSpeed's ZeRO, PyTorch FSDP1): all
    parameters are flattened into one buffer of N elements, padded to a multiple of N_d, and
    rank r owns elements [r·⌈N/N_d⌉, (r+1)·⌈N/N_d⌉) — so every rank holds ⌈N/N_d⌉ elements of
    each sharded state, padding included. ``padding="per_parameter"`` pads each parameter to
    a multiple of N_d instead (per-parameter sharding, as FSDP2 pads dim 0). Adam keeps two
    states (momentum, variance) of ``state_dtype`` per element, plus an fp32 master copy when
    the parameters are in lower precision (ZeRO's K = 4 + 4 + 4 = 12). Which states are
    sharded per stage: ZeRO, Rajbhandari et al. 2020, §5 (see ``zero_memory``).

    Args:
        module: an ``nn.Module`` (anything with ``parameters()``); only trainable
            parameters (``requires_grad``) count.
        dp_degree: N_d, the data-parallel degree.
        stage: 0, 1, 2 or 3.
        param_dtype: dtype (or bytes per element) of the working parameters (default: the
            module's own).
        grad_dtype: dtype of the gradients (default: ``param_dtype``).
        state_dtype: dtype of Adam's momentum and variance (default 4 bytes: fp32).
        master_weights: keep an fp32 master copy in the optimizer (default: when the
            parameters are narrower than 4 bytes, i.e. mixed precision).
        padding: ``"flat"`` (one padded flat buffer) or ``"per_parameter"``.

    Returns:
        The ``MemoryBreakdown`` of one rank; ``n_params`` is the unpadded count.

    Raises:
        ValueError: as ``zero_memory``, an unknown ``padding``, or a module with no
            trainable parameters.
        TypeError: a dtype that is neither a torch dtype nor a byte count.
    """
    nd = check_dp(dp_degree)
    stage = check_stage(stage)
    if padding not in ("flat", "per_parameter"):
        raise ValueError(f"padding must be 'flat' or 'per_parameter', got {padding!r}")
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the module has no trainable parameters")
    n = sum(p.numel() for p in params)
    if padding == "flat":
        shard = -(-n // nd)  # ⌈N/N_d⌉: the padded flat buffer split evenly
    else:
        shard = sum(-(-p.numel() // nd) for p in params)
    pb = _itemsize(param_dtype if param_dtype is not None else params[0].dtype)
    gb = _itemsize(grad_dtype) if grad_dtype is not None else pb
    sb = _itemsize(state_dtype)
    if master_weights is None:
        master_weights = pb < 4
    k = 2 * sb + (4 if master_weights else 0)
    return MemoryBreakdown(
        stage,
        float(n),
        nd,
        float(pb * (shard if stage >= 3 else n)),
        float(gb * (shard if stage >= 2 else n)),
        float(k * (shard if stage >= 1 else n)),
    )
