"""The rows every benchmark returns, and what the benchmarks share: sizes and device.

Introduced in notebooks/01_point_to_point.ipynb (``labkit.bench`` re-exports ``BenchResult``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from labkit.launcher import get_device

GB = 1e9  # bytes per GB, as nccl-tests counts


@dataclass(frozen=True)
class BenchResult:
    """One row of a benchmark: an operation on ``n_bytes``, timed ``iters`` times.

    ``time_s`` is the median time of one operation over the iterations (for a ping-pong, the
    one-way time: half a round trip); ``times_s`` holds every sample, and ``time_min_s`` is
    their minimum — the best case, which other processes' noise on a shared machine cannot
    inflate.
    """

    op: str  # "p2p" (ping-pong), or a collective: "all_reduce", "all_gather", ...
    n_bytes: int
    time_s: float
    algbw_gbps: float
    busbw_gbps: float
    world_size: int
    backend: str
    device: str
    iters: int
    times_s: tuple[float, ...] = field(default=(), repr=False)

    @property
    def time_min_s(self) -> float:
        """Fastest sample, in seconds (``time_s`` when no samples were kept)."""
        return min(self.times_s) if self.times_s else self.time_s

    @property
    def latency_us(self) -> float:
        """Median time of one operation in microseconds."""
        return self.time_s * 1e6

    @property
    def bandwidth_gbps(self) -> float:
        """Bytes moved per second of one operation, in GB/s (nccl-tests' algbw)."""
        return self.algbw_gbps

    def as_dict(self) -> dict:
        """The row as plain data (samples left out), e.g. for a table or JSON."""
        row = asdict(self)
        row.pop("times_s")
        return row


def check_sizes(sizes_bytes: Iterable[int]) -> list[int]:
    """The sizes sorted and deduplicated.

    Raises:
        ValueError: no size, or one that is not a positive int.
    """
    given = list(sizes_bytes)
    if not given or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in given):
        raise ValueError(f"sizes_bytes must be positive ints, got {given!r}")
    return sorted(set(given))


def default_device() -> torch.device:
    """This rank's device: the launcher's (or a lab script's), else CUDA under pure NCCL.

    Outside labkit (plain torchrun code) only a group that is NCCL alone says where the
    tensors must be; ``"cpu:gloo,cuda:nccl"`` serves both, and the CPU is the safe choice.
    """
    try:
        return get_device()
    except RuntimeError:  # not inside lk.launch or a lab script: the backend decides
        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
