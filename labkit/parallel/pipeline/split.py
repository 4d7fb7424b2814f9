"""Cut an ``nn.Sequential`` into consecutive pipeline stages, and find their output shapes.

Introduced in notebooks/11_pipeline_parallel.ipynb (the split itself is the idea of
notebooks/10_model_parallel.ipynb: a model's layers placed on consecutive devices).

The stages share their layers (and parameters) with the model they were cut from, so a
gradient computed through the stages lands in the original model's ``.grad`` fields and can
be compared with a single-process run by parameter name.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["output_shapes", "split_sequential"]


def split_sequential(model: nn.Sequential, n_stages: int) -> list[nn.Sequential]:
    """Cut ``model`` into ``n_stages`` runs of consecutive layers, as equal in count as possible.

    GPipe (Huang et al. 2019, §2.1) partitions a sequence of layers into consecutive cells;
    here the first ``len(model) % n_stages`` stages get one layer more.

    Args:
        model: the layers, in order.
        n_stages: how many stages.

    Returns:
        list[nn.Sequential]: stage ``s`` holds layers ``[a_s, a_{s+1})`` of ``model`` (the same
        module objects, not copies).

    Raises:
        ValueError: ``n_stages`` < 1 or more stages than layers.
    """
    n = len(model)
    if not 1 <= n_stages <= n:
        raise ValueError(f"cannot cut {n} layers into {n_stages} stages (need 1 ≤ stages ≤ layers)")
    q, extra = divmod(n, n_stages)
    stages, start = [], 0
    for s in range(n_stages):
        stop = start + q + (1 if s < extra else 0)
        stages.append(nn.Sequential(*[model[i] for i in range(start, stop)]))
        start = stop
    return stages


def output_shapes(stages: Sequence[nn.Module], example: torch.Tensor) -> list[tuple[int, ...]]:
    """Each stage's output shape for one micro-batch, by running ``example`` through them all.

    The runtime needs them to allocate receive buffers (send/recv move raw tensors, no
    shapes), as ``torch.distributed.pipelining.PipelineStage`` infers them with ``input_args``.

    Args:
        stages: every stage, in order.
        example: one micro-batch of input.

    Returns:
        list[tuple[int, ...]]: ``shapes[s]`` is stage ``s``'s output shape.
    """
    shapes = []
    with torch.no_grad():
        x = example
        for stage in stages:
            x = stage(x)
            shapes.append(tuple(x.shape))
    return shapes
