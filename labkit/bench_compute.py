"""The FLOP rate a rank can reach: a matrix-product benchmark, the denominator of MFU.

Introduced in notebooks/20_performance_tuning.ipynb.

Model FLOPs utilisation (MFU, Chowdhery et al. 2022, "PaLM", Appendix B) divides the FLOPs a
training step needs by the time it took and by the device's peak rate. A data sheet gives a
GPU's peak; for a CPU rank the honest peak is what a large matrix product reaches in the same
conditions as training — the same dtype, the same threads per rank, the other ranks running
beside it — so ``peak_flops`` measures it, and keeps the fastest of its products: a peak is the
best the machine does, and on a shared machine the slower products are the disturbed ones (as
``lk.bench.alpha_beta_fit(stat="min")`` keeps the fastest round trips). An n × n product costs
2n³ FLOPs (n³ multiply-adds)::

    peak = lk.bench.peak_flops(n=512, threads=torch.get_num_threads())   # inside a rank
    lk.profile.mfu(flops_per_step, step_s, peak.flops_per_s)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from labkit.trace import sync_device

__all__ = ["PeakFlops", "peak_flops"]


@dataclass(frozen=True)
class PeakFlops:
    """A measured matrix-product rate.

    Attributes:
        flops_per_s: 2n³ over the fastest product's time: the peak.
        n: the matrices' size (n × n).
        dtype: e.g. "float32".
        threads: intra-op threads during the measurement (``torch.get_num_threads()``).
        device: where it ran, e.g. "cpu" or "cuda:0".
        seconds: the fastest product's time.
        times_s: every timed product.
    """

    flops_per_s: float
    n: int
    dtype: str
    threads: int
    device: str
    seconds: float
    times_s: tuple[float, ...]

    @property
    def gflops(self) -> float:
        return self.flops_per_s / 1e9

    @property
    def median_flops_per_s(self) -> float:
        """2n³ over the median product's time: the typical rate, below the peak."""
        return 2 * self.n**3 / statistics.median(self.times_s)


def peak_flops(
    n: int = 512,
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    repeats: int = 10,
    warmup: int = 2,
    device: Any = None,
    clock: Callable[[], float] = time.perf_counter,
) -> PeakFlops:
    """Time ``repeats`` products of two n × n matrices and return the fastest one's rate.

    Args:
        n: matrix size (at least 1); large enough that the product, not its call, dominates.
        dtype: the training dtype (``torch.float32``, ``torch.bfloat16``, ...).
        threads: intra-op threads to measure with (CPU; restored afterwards). None: leave
            ``torch.get_num_threads()`` as it is, e.g. the launcher's setting in a rank.
        repeats: timed products (at least 1).
        warmup: untimed products first (allocation, kernel selection).
        device: where to compute (None: the CPU); on a GPU every product is timed between
            synchronisations.
        clock: seconds, monotonic.

    Returns:
        PeakFlops.

    Raises:
        ValueError: ``n < 1``, ``repeats < 1``, ``warmup < 0`` or ``threads < 1``.
    """
    if n < 1 or repeats < 1 or warmup < 0:
        raise ValueError(f"need n >= 1, repeats >= 1, warmup >= 0; got {n}, {repeats}, {warmup}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    device = torch.device(device if device is not None else "cpu")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
        samples = []
        for i in range(warmup + repeats):
            sync_device(device)
            start = clock()
            torch.mm(a, b)
            sync_device(device)
            if i >= warmup:
                samples.append(clock() - start)
        used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    t = min(samples)
    return PeakFlops(
        flops_per_s=2 * n**3 / t,
        n=n,
        dtype=str(dtype).removeprefix("torch."),
        threads=used,
        device=str(device),
        seconds=t,
        times_s=tuple(samples),
    )
