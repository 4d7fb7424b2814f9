"""ZeRO from scratch: shard optimizer states (stage 1), gradients (2) and parameters (3).

Introduced in notebooks/13_zero_and_fsdp.ipynb. Implements ZeRO-DP of Rajbhandari, Rasley,
Ruwase and He, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
SC 2020: §5.1 P_os (``ZeroStage1``), §5.2 P_os+g (``ZeroStage2``), §5.3 P_os+g+p
(``ZeroStage3``). Every stage trains to the same parameters as ``torch.optim.Adam`` on one
process with the whole batch; what changes is what each rank keeps, measured by
``rank_bytes()`` and predicted by ``model_bytes()`` (``labkit.memory.zero_rank_bytes`` with
per-parameter padded shards).

Communication per step, one call per unit (a module with parameters of its own, e.g. each
``Linear``): stage 1 reduce-scatters the gradients in ``step()`` and all-gathers the
parameters (ZeRO §7.2.1: 2Ψ, as data parallelism's all-reduce); stage 2 reduce-scatters the
gradients during backward and all-gathers the parameters; stage 3
all-gathers the parameters before each unit's forward and again before its backward, and
reduce-scatters the gradients. Usage, on every rank::

    zero = lk.parallel.zero.ZeroOptimizer(model, stage=2, lr=1e-2)
    loss_fn(model(x), y).backward()
    zero.step()
    zero.zero_grad()
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from labkit.parallel.zero.base import ZeroBase, storage_bytes
from labkit.parallel.zero.comm import all_gather_unit, reduce_scatter_unit
from labkit.parallel.zero.fsdp import apply_fully_shard, fsdp_rank_bytes
from labkit.parallel.zero.layout import Unit, find_units, shard_bounds, shard_size
from labkit.parallel.zero.stage1 import ZeroStage1
from labkit.parallel.zero.stage2 import ZeroStage2
from labkit.parallel.zero.stage3 import ZeroStage3

__all__ = [
    "Unit",
    "ZeroBase",
    "ZeroOptimizer",
    "ZeroStage1",
    "ZeroStage2",
    "ZeroStage3",
    "all_gather_unit",
    "apply_fully_shard",
    "find_units",
    "fsdp_rank_bytes",
    "reduce_scatter_unit",
    "shard_bounds",
    "shard_size",
    "storage_bytes",
]

_STAGES = {1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}


def ZeroOptimizer(  # noqa: N802 - reads like the class it returns
    module: nn.Module,
    stage: int,
    group: dist.ProcessGroup | None = None,
    **adam_kwargs: float | tuple[float, float],
) -> ZeroBase:
    """ZeRO stage ``stage`` over ``module``'s parameters, with Adam.

    ZeRO, Rajbhandari et al. 2020, §5.

    Args:
        module: the model on this rank.
        stage: 1 (P_os), 2 (P_os+g) or 3 (P_os+g+p).
        group: the data-parallel group (None: the default group).
        **adam_kwargs: ``lr``, ``betas``, ``eps``, ``weight_decay``.

    Returns:
        A ``ZeroStage1``, ``ZeroStage2`` or ``ZeroStage3``.

    Raises:
        ValueError: an unknown stage.
    """
    if isinstance(stage, bool) or stage not in _STAGES:
        raise ValueError(f"stage must be 1, 2 or 3, got {stage!r}")
    return _STAGES[stage](module, group=group, **adam_kwargs)
