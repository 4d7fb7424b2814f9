"""What a data-parallel step sends and how long its gradient all-reduces take: pure arithmetic.

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb.

- ``bucketed_backward_s``: when the last bucket's all-reduce finishes, given when each
  bucket's gradients were ready, on one link that carries one all-reduce at a time — with
  overlap (a bucket goes out as soon as it is ready; Li et al. 2020, "PyTorch Distributed:
  Experiences on Accelerating Data Parallel Training", §3.2.3) or without (all go out when
  backward has finished).
- ``powersgd_numel``: the elements PowerSGD all-reduces per step (Vogels, Karimireddy and
  Jaggi 2019, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
  Optimization", Algorithm 1: a rank-r approximation P Qᵀ of an n × m gradient sends
  P (n × r) and Q (m × r), r(n + m) numbers instead of n·m), with the rule torch's
  ``powerSGD_hook`` uses to leave a tensor uncompressed.

Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from labkit.costmodel.network import Network
from labkit.costmodel.predict import predict

__all__ = ["bucketed_backward_s", "powersgd_numel"]


def bucketed_backward_s(
    ready_s: Sequence[float],
    bucket_bytes: Sequence[float],
    world_size: int,
    network: Network,
    overlap: bool = True,
    backward_s: float | None = None,
) -> float:
    """Time from the start of backward until the last bucket's all-reduce has finished.

    Buckets are reduced in order on one link: bucket k starts when it is ready (with
    overlap; when backward ends without) and the previous bucket has finished, and takes
    ``predict("all_reduce", bucket_bytes[k], world_size, network)``. Li et al. 2020 §3.2.3.

    Args:
        ready_s: per bucket, in reduction order, when its last gradient is ready (seconds
            from the start of backward; non-decreasing in a real backward, but not required).
        bucket_bytes: per bucket, its size in bytes.
        world_size: ranks p.
        network: the link's α and β.
        overlap: False: every bucket waits for the end of backward.
        backward_s: when backward ends (default: the last ``ready_s``).

    Returns:
        Seconds from the start of backward to the end of the last all-reduce (``backward_s``
        when there are no buckets).

    Raises:
        ValueError: lengths differ, or a time or size is negative.
    """
    if len(ready_s) != len(bucket_bytes):
        raise ValueError(f"{len(ready_s)} ready times for {len(bucket_bytes)} buckets")
    if any(t < 0 for t in ready_s) or any(n < 0 for n in bucket_bytes):
        raise ValueError("ready times and bucket sizes must be >= 0")
    end_backward = max(ready_s, default=0.0) if backward_s is None else backward_s
    if end_backward < max(ready_s, default=0.0):
        raise ValueError(f"backward_s={backward_s} is before a bucket is ready")
    link_free = 0.0
    for ready, n_bytes in zip(ready_s, bucket_bytes, strict=True):
        start = max(ready if overlap else end_backward, link_free)
        link_free = start + predict("all_reduce", n_bytes, world_size, network)
    return max(link_free, end_backward)


def _should_compress(n: int, m: int, rank: int, min_compression_rate: float) -> bool:
    """torch's ``powerSGD_hook._should_compress``: compress only if it saves enough."""
    return (n + m) * rank * min_compression_rate < n * m


def powersgd_numel(
    shapes: Sequence[Sequence[int]],
    rank: int,
    min_compression_rate: float = 2.0,
) -> tuple[int, int]:
    """Elements one PowerSGD step all-reduces for gradients of ``shapes``, and without it.

    Each gradient is viewed as an n × m matrix (``shape[0]`` × the rest; a vector is
    n × 1). With ``r = min(n, m, rank)`` it is compressed — P (n × r) and Q (m × r) are
    all-reduced, r(n + m) elements — when ``(n + m)·r·min_compression_rate < n·m``;
    otherwise it is all-reduced whole (n·m). Vogels et al. 2019, Algorithm 1; the rule of
    ``torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook``.

    Args:
        shapes: the gradients' shapes (e.g. ``[p.shape for p in model.parameters()]``).
        rank: the approximation rank r (``matrix_approximation_rank``, ≥ 1).
        min_compression_rate: how much smaller a compressed tensor must be (torch's default 2).

    Returns:
        ``(sent, dense)``: elements PowerSGD all-reduces, and elements plain all-reduce would.

    Raises:
        ValueError: ``rank < 1`` or a shape with a negative size.
    """
    if rank < 1:
        raise ValueError(f"rank must be >= 1, got {rank}")
    sent = dense = 0
    for shape in shapes:
        if any(d < 0 for d in shape):
            raise ValueError(f"bad shape {tuple(shape)}")
        numel = math.prod(shape)
        n = shape[0] if len(shape) else 1
        m = numel // n if n else 0
        r = min(n, m, rank)
        dense += numel
        sent += r * (n + m) if _should_compress(n, m, r, min_compression_rate) else numel
    return sent, dense
