"""Bucket assignment for ``DataParallelBucketed``: reverse registration order, size-capped.

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb. Pure bookkeeping: no process group.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["MB", "assign_buckets"]

MB = 1024 * 1024  # bucket_cap_mb counts mebibytes, as torch's DDP does (bucket_cap_mb * 1024²)


def assign_buckets(
    params: nn.Module | Iterable[tuple[str, torch.Tensor]], bucket_cap_mb: float = 25.0
) -> list[list[str]]:
    """Group the parameters that need gradients into buckets, in the order gradients arrive.

    Backward produces gradients roughly in reverse order of the forward pass, which for
    most models is reverse registration order, so buckets are filled walking the
    parameters backwards (Li et al. 2020, §3.2.3; ``torch.nn.parallel.DistributedDataParallel``
    reverses its bucket list for the same reason). A bucket is closed when adding the next
    parameter would take it over ``bucket_cap_mb``, so a parameter larger than the cap is a
    bucket of its own; a change of dtype also closes it (a bucket is one flat tensor).
    Unlike torch, the first bucket has no special smaller cap.

    Args:
        params: a module, or ``(name, parameter)`` pairs in registration order.
            Parameters with ``requires_grad=False`` are skipped.
        bucket_cap_mb: the cap in MiB (> 0).

    Returns:
        The buckets, each a list of parameter names in the order they are reduced.

    Raises:
        ValueError: if ``bucket_cap_mb`` is not positive.
    """
    if not bucket_cap_mb > 0:
        raise ValueError(f"bucket_cap_mb must be > 0, got {bucket_cap_mb}")
    named = params.named_parameters() if isinstance(params, nn.Module) else params
    cap_bytes = int(bucket_cap_mb * MB)
    buckets: list[list[str]] = []
    size, dtype = 0, None
    for name, p in reversed([(n, p) for n, p in named if p.requires_grad]):
        n_bytes = p.numel() * p.element_size()
        if not buckets or size + n_bytes > cap_bytes or p.dtype != dtype:
            buckets.append([])
            size, dtype = 0, p.dtype
        buckets[-1].append(name)
        size += n_bytes
    return buckets
