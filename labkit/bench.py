"""Communication benchmarks: point-to-point ping-pong, the α-β fit of its times, collectives.

Introduced in notebooks/01_point_to_point.ipynb (ping-pong, fit) and
notebooks/05_communication_cost.ipynb (``collective``, in ``labkit/bench_collectives.py``);
``peak_flops``, the matrix-product rate MFU divides by, lives in ``labkit/bench_compute.py``.

Every benchmark returns a list of ``BenchResult`` rows, one per message size, so results of
different operations print, plot and fit the same way. The columns follow nccl-tests
(``doc/PERFORMANCE.md``): ``time_s`` is the time of one operation, ``algbw_gbps`` is
``n_bytes / time_s`` and ``busbw_gbps`` is ``algbw`` times the operation's bus factor (1 for a
point-to-point transfer; ``2(n-1)/n`` for all-reduce, which notebook 05 adds). GB are 10⁹ bytes.

Run from a cell or a script; every rank calls the benchmark, the measuring rank returns rows:

    rows = lk.launch(lambda r, w: lk.bench.p2p_pingpong([8, 1 << 20], iters=20), world_size=2)[0]
    print(lk.bench.format_table(rows)); fit = lk.bench.alpha_beta_fit(rows)
    rows = lk.launch(lambda r, w: lk.bench.collective("all_reduce", [8, 1 << 20]), 4)[0]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from labkit.bench_between import WAKE_OPS, WAKE_SIZES
from labkit.bench_calibrate import add_launch, calibrate, measure_probes, probe_rank
from labkit.bench_collectives import COLLECTIVES, collective, collective_sizes
from labkit.bench_compute import PeakFlops, peak_flops
from labkit.bench_framework import framework_costs, strategy_step_s
from labkit.bench_handoff import handoff
from labkit.bench_p2p import p2p_pingpong
from labkit.bench_results import GB, BenchResult, check_sizes
from labkit.bench_workload import capstone_workload, workload_from_model
from labkit.costmodel.network import least_squares_alpha_beta
from labkit.launcher import launch, settle

__all__ = [
    "COLLECTIVES",
    "AlphaBeta",
    "BenchResult",
    "WAKE_OPS",
    "WAKE_SIZES",
    "PeakFlops",
    "add_launch",
    "alpha_beta_fit",
    "calibrate",
    "capstone_workload",
    "collective",
    "collective_sizes",
    "format_table",
    "framework_costs",
    "handoff",
    "launch_collective",
    "measure_probes",
    "message_sizes",
    "p2p_pingpong",
    "peak_flops",
    "probe_rank",
    "strategy_step_s",
    "workload_from_model",
]


def message_sizes(smallest: int = 1, largest: int = 1 << 24, factor: int = 4) -> list[int]:
    """Message sizes in bytes from ``smallest`` to ``largest``, each ``factor`` times the last.

    Args:
        smallest: first size in bytes (at least 1).
        largest: last size in bytes (included when the sequence reaches it).
        factor: ratio of neighbouring sizes (at least 2).

    Returns:
        The increasing list of sizes.

    Raises:
        ValueError: ``smallest < 1``, ``largest < smallest`` or ``factor < 2``.
    """
    if smallest < 1 or largest < smallest or factor < 2:
        raise ValueError(
            f"need 1 <= smallest <= largest and factor >= 2, got smallest={smallest}, "
            f"largest={largest}, factor={factor}"
        )
    sizes = [smallest]
    while sizes[-1] * factor <= largest:
        sizes.append(sizes[-1] * factor)
    return sizes


@dataclass(frozen=True)
class AlphaBeta:
    """Hockney's model of one message: ``t(n) = alpha + n * beta``.

    ``alpha`` (s) is the start-up latency, ``beta`` (s/byte) the time per byte, so
    ``1 / beta`` is the asymptotic bandwidth and ``alpha / beta`` the message size at which
    half of it is reached (Hockney's n½).
    """

    alpha: float  # s
    beta: float  # s/byte

    def time_s(self, n_bytes: float) -> float:
        """Predicted one-way time of an ``n_bytes`` message, in seconds."""
        return self.alpha + n_bytes * self.beta

    @property
    def latency_us(self) -> float:
        """α in microseconds."""
        return self.alpha * 1e6

    @property
    def bandwidth_gbps(self) -> float:
        """1/β in GB/s (infinite when β is 0)."""
        return 1 / self.beta / GB if self.beta > 0 else float("inf")

    @property
    def n_half_bytes(self) -> float:
        """Hockney's n½ = α/β: the size that reaches half the asymptotic bandwidth."""
        return self.alpha / self.beta if self.beta > 0 else float("inf")


def alpha_beta_fit(
    results: Sequence[BenchResult], relative: bool = True, stat: str = "median"
) -> AlphaBeta:
    """Fit Hockney's ``t = alpha + n * beta`` to measured one-way times by least squares.

    Hockney, "The communication challenge for MPP: Intel Paragon and Meiko CS-2", Parallel
    Computing 20(3), 1994 (the α-β or latency-bandwidth model; notebook 05 builds the
    collectives' costs on it, after Thakur, Rabenseifner and Gropp 2005).

    With ``relative=True`` (default) each point's residual is divided by its measured time,
    so a 1-byte message (which sets α) weighs as much as a 16 MB one (which sets β); plain
    least squares (``relative=False``) lets the largest messages decide α as well.

    ``stat`` picks which time of each row is fitted: ``"median"`` (``time_s``, a typical
    message) or ``"min"`` (``time_min_s``, the best case). On a machine shared with other
    busy processes the medians carry their scheduling delays (multiples of a time slice,
    ~1-4 ms), which swamp a ~100 µs α; the minimum over many iterations does not.

    Args:
        results: rows with ``n_bytes`` and ``time_s`` (at least two distinct sizes).
        relative: minimise relative rather than absolute residuals.
        stat: ``"median"`` or ``"min"``: which time of each row to fit.

    Returns:
        The fitted ``AlphaBeta``; exact when the times lie on a line.

    Raises:
        ValueError: fewer than two distinct sizes, a non-positive time, or an unknown ``stat``.
    """
    if stat not in ("median", "min"):
        raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
    ns = [float(r.n_bytes) for r in results]
    ts = [float(r.time_s if stat == "median" else r.time_min_s) for r in results]
    if len(set(ns)) < 2:
        raise ValueError("alpha_beta_fit needs results for at least two different sizes")
    if any(t <= 0 for t in ts):
        raise ValueError("alpha_beta_fit needs positive times")
    alpha, beta = least_squares_alpha_beta(ns, ts, relative)
    return AlphaBeta(alpha=alpha, beta=beta)


def format_table(results: Sequence[BenchResult]) -> str:
    """The rows as a fixed-width text table (size, times, bandwidths), nccl-tests style.

    Args:
        results: benchmark rows.

    Returns:
        The table, one line per row under a header line; ``time`` is the median, ``min`` the
        fastest sample, both in microseconds; bandwidths use the median.
    """
    head = ("op", "size (B)", "time (us)", "min (us)", "algbw (GB/s)", "busbw (GB/s)")
    lines = ["{:>10} {:>12} {:>12} {:>12} {:>13} {:>13}".format(*head)]
    for r in results:
        lines.append(
            f"{r.op:>10} {r.n_bytes:>12d} {r.latency_us:>12.1f} {r.time_min_s * 1e6:>12.1f} "
            f"{r.algbw_gbps:>13.4f} {r.busbw_gbps:>13.4f}"
        )
    return "\n".join(lines)


def _run_on_rank(rank: int, world_size: int, name: str, sizes, iters: int, warmup: int) -> list:
    if name == "p2p":
        return p2p_pingpong(sizes, iters=iters, warmup=warmup)
    return collective(name, sizes, iters=iters, warmup=warmup)


def launch_collective(
    name: str,
    sizes_bytes: Iterable[int] | None = None,
    world_size: int = 2,
    backend: object = "auto",
    iters: int = 20,
    warmup: int = 3,
    device: str = "auto",
    timeout: float = 600.0,
) -> list[BenchResult]:
    """Launch ``world_size`` ranks and benchmark ``name`` there (``labkit bench`` runs this).

    Args:
        name: a collective of ``COLLECTIVES``, or ``"p2p"`` (ping-pong between ranks 0 and 1).
        sizes_bytes: sizes in bytes (default: ``collective_sizes()``).
        world_size: ranks to launch.
        backend: as ``lk.launch`` (a name such as ``"gloo"``, ``"labkit_shm"``, or a spec).
        iters: timed calls per size.
        warmup: untimed calls per size.
        device: as ``lk.launch``.
        timeout: seconds before the launch is stopped.

    Returns:
        Rank 0's rows.

    Raises:
        ValueError: an unknown collective or bad sizes (before anything is launched).
        labkit.RankError: a rank failed.
    """
    if name != "p2p" and name not in COLLECTIVES:
        raise ValueError(f"unknown collective {name!r}; known: p2p, {', '.join(COLLECTIVES)}")
    sizes = check_sizes(collective_sizes() if sizes_bytes is None else sizes_bytes)
    args = (name, sizes, iters, warmup)
    settle()  # the zygote's warm-up imports, before anything is timed beside them
    out = launch(
        _run_on_rank, world_size, backend=backend, args=args, device=device, timeout=timeout
    )
    return out[0]
