"""The data-parallel flavours as verbs: ``apply_ddp``, ``apply_zero``, ``apply_fsdp``.

Introduced in notebooks/18_hybrid_parallel.ipynb (the flavours are notebooks 07 and 13's).

Applied last (``labkit.parallel.compose``'s order), each acts on the dp axis only:

- ``apply_ddp``: labkit's ``DataParallelBucketed`` — replicas, gradients averaged in buckets
  during backward (one all-reduce per bucket);
- ``apply_zero``: labkit's ZeRO-1/2/3 (``ZeroOptimizer``) — it shards the optimizer states,
  then the gradients, then the parameters, and is the optimizer (Adam) itself;
- ``apply_fsdp``: PyTorch's FSDP2 ``fully_shard`` per unit (ZeRO-3 in production); on a
  model whose parameters are DTensors on the tp axis of the same mesh it shards them again
  over dp (2-D DTensors), torchtitan's ``apply_fsdp`` after ``apply_tp``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch.distributed as dist
from torch import nn

from labkit.parallel.ddp import DataParallelBucketed
from labkit.parallel.zero import ZeroBase, ZeroOptimizer, apply_fully_shard

__all__ = ["apply_ddp", "apply_fsdp", "apply_zero"]


def _group(dp: Any) -> dist.ProcessGroup:
    return dp if isinstance(dp, dist.ProcessGroup) else dp.get_group()


def apply_ddp(module: nn.Module, dp: Any, bucket_cap_mb: float = 25.0) -> DataParallelBucketed:
    """Wrap ``module`` in labkit's bucketed DDP over the data-parallel ranks.

    Args:
        module: the model (or stage) on this rank, tensor-parallel already if tp > 1.
        dp: the dp ``DeviceMesh`` (1-D) or ``ProcessGroup``.
        bucket_cap_mb: bucket size cap in MiB, as torch DDP's argument.

    Returns:
        The wrapper (``.module`` is ``module``); its parameters were broadcast from the dp
        group's first rank.
    """
    return DataParallelBucketed(module, group=_group(dp), bucket_cap_mb=bucket_cap_mb)


def apply_zero(
    module: nn.Module, stage: int, dp: Any, **adam_kwargs: float | tuple[float, float]
) -> ZeroBase:
    """Shard ``module``'s model states over the data-parallel ranks with labkit's ZeRO ``stage``.

    Args:
        module: the model on this rank (hooks are added; no wrapper).
        stage: 1, 2 or 3 (Rajbhandari et al. 2020, §5).
        dp: the dp ``DeviceMesh`` (1-D) or ``ProcessGroup``.
        **adam_kwargs: ``lr``, ``betas``, ``eps``, ``weight_decay`` of its Adam.

    Returns:
        The ZeRO stage: it is the optimizer (``step``, ``zero_grad``, ``.optimizer`` for a
        learning-rate schedule).

    Raises:
        ValueError: an unknown stage.
    """
    return ZeroOptimizer(module, stage, group=_group(dp), **adam_kwargs)


def apply_fsdp(module: nn.Module, dp: Any) -> nn.Module:
    """Shard ``module`` with FSDP2 over the dp ranks: ``fully_shard`` per unit, the root last.

    Args:
        module: the model on this rank; its parameters plain tensors or DTensors on the tp
            axis of the mesh ``dp`` belongs to.
        dp: the dp ``DeviceMesh`` (1-D; ``mesh["dp"]`` of a 2-D mesh under FSDP2 × TP) or
            its ``ProcessGroup``.

    Returns:
        ``module``, now an ``FSDPModule`` with DTensor parameters.
    """
    # FSDP2 warns when a wrapped Linear returns a view (a 3-D input's output is one): an
    # in-place op on it would skip a hook. labkit's models add their residuals out of place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    return apply_fully_shard(module, dp)
