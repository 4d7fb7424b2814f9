"""Measured speedups: a baseline and its variants timed in the same run, interleaved.

Introduced in notebooks/20_performance_tuning.ipynb.

On a shared machine the load drifts during a run, so a variant timed ten minutes after its
baseline can look faster or slower for reasons of its own. ``measure_speedups`` times every
variant once per *round*, rotating the order from round to round, so all of them see the
same load; a ``SpeedupTable`` keeps the per-round times and reports, per variant, the
median time, the ratio of medians ``median(baseline) / median(variant)``, how many rounds
it won (baseline slower than the variant within the same round: a paired comparison) and
the worst paired ratio. Medians, not means: one round disturbed by another process moves a
mean, not a median; ``noise`` is the median absolute deviation over the median, a spread
that one outlier does not inflate either (Hoefler and Belli 2015, "Scientific Benchmarking
of Parallel Computing Systems": nonparametric statistics for non-normal timings).

``amdahl_speedup`` is the bound for speeding up a fraction of the step (Amdahl 1967).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.trace import sync_device

__all__ = ["SpeedupRow", "SpeedupTable", "amdahl_speedup", "measure_speedups"]


def amdahl_speedup(fraction: float, factor: float = math.inf) -> float:
    """Whole-step speedup when a ``fraction`` of the step gets ``factor`` times faster.

    Amdahl 1967: ``1 / ((1 - f) + f / s)``; with ``s = ∞`` (the part removed or fully hidden) the
    bound is ``1 / (1 - f)``.

    Args:
        fraction: the share f of the step that is sped up, in [0, 1].
        factor: how many times faster that part gets, s > 0 (``math.inf``: it vanishes).

    Returns:
        The speedup of the whole step.

    Raises:
        ValueError: ``fraction`` outside [0, 1] or ``factor`` ≤ 0.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    if not factor > 0:
        raise ValueError(f"factor must be > 0, got {factor}")
    rest = 1.0 - fraction + fraction / factor
    return math.inf if rest == 0 else 1.0 / rest


@dataclass(frozen=True)
class SpeedupRow:
    """One variant: median time (s), ratio of medians vs the baseline, rounds won, worst round.

    ``wins`` counts the rounds where the baseline took longer than this variant; ``min_ratio``
    is the smallest per-round ratio baseline / variant.
    """

    name: str
    median_s: float
    ratio: float
    min_ratio: float
    wins: int
    rounds: int


@dataclass(frozen=True)
class SpeedupTable:
    """Per-round times of a baseline and its variants, measured in the same run.

    Attributes:
        baseline: the name of the baseline (a key of ``times``).
        times: name → seconds per round; round i of every variant ran in the same round.

    Raises:
        ValueError: the baseline is missing, rounds differ in number or are empty, or a
            time is not a finite positive number.
    """

    baseline: str
    times: Mapping[str, Sequence[float]]

    def __post_init__(self) -> None:
        if self.baseline not in self.times:
            raise ValueError(f"baseline {self.baseline!r} is not one of {list(self.times)}")
        lengths = {name: len(t) for name, t in self.times.items()}
        if len(set(lengths.values())) != 1 or 0 in lengths.values():
            raise ValueError(f"every variant needs the same number (≥ 1) of rounds: {lengths}")
        for name, ts in self.times.items():
            if not all(isinstance(t, (int, float)) and math.isfinite(t) and t > 0 for t in ts):
                raise ValueError(f"{name!r}: times must be finite and > 0, got {list(ts)}")
        object.__setattr__(self, "times", {k: tuple(map(float, v)) for k, v in self.times.items()})

    @classmethod
    def slowest_rank(cls, per_rank: Sequence[SpeedupTable]) -> SpeedupTable:
        """Merge every rank's table: per round, the slowest rank's time (it sets the pace).

        Args:
            per_rank: each rank's table (same baseline, variants and rounds).

        Returns:
            SpeedupTable: per variant and round, the maximum over ranks.

        Raises:
            ValueError: no tables, or tables with different baselines or variants.
        """
        if not per_rank:
            raise ValueError("slowest_rank needs at least one table")
        first = per_rank[0]
        for t in per_rank[1:]:
            if t.baseline != first.baseline or list(t.times) != list(first.times):
                raise ValueError("the ranks' tables differ in baseline or variants")
        times = {n: [max(t.times[n][i] for t in per_rank) for i in range(len(first.times[n]))]
                 for n in first.times}  # fmt: skip
        return cls(first.baseline, times)

    @property
    def names(self) -> list[str]:
        """The baseline and variants, in the order measured."""
        return list(self.times)

    def median_s(self, name: str) -> float:
        """The median time of ``name`` over the rounds, seconds."""
        return statistics.median(self.times[name])

    def ratio(self, name: str) -> float:
        """``median(baseline) / median(name)``: above 1 when ``name`` is faster."""
        return self.median_s(self.baseline) / self.median_s(name)

    def paired_ratios(self, name: str) -> list[float]:
        """Per round, baseline time over ``name``'s time in that round."""
        return [b / v for b, v in zip(self.times[self.baseline], self.times[name], strict=True)]

    def noise(self, name: str) -> float:
        """Relative spread of ``name``'s rounds: median absolute deviation over the median."""
        m = self.median_s(name)
        return statistics.median(abs(t - m) for t in self.times[name]) / m

    def rows(self) -> list[SpeedupRow]:
        """One row per variant, baseline first, in the order measured."""
        rows = []
        for n in self.times:
            paired = self.paired_ratios(n)
            wins = sum(r > 1.0 for r in paired)
            rows.append(SpeedupRow(n, self.median_s(n), self.ratio(n), min(paired), wins,
                                   len(paired)))  # fmt: skip
        return rows

    def format(self, model_s: Mapping[str, float] | None = None) -> str:
        """A text table: median ms, speedup vs the baseline, rounds won; model if given.

        Args:
            model_s: name → a model's time (s) for the variants that have one; adds the
                model's ms and measured/model columns.

        Returns:
            The table as lines of text.
        """
        model_s = model_s or {}
        width = max(len(n) for n in self.times) + 2
        head = f"{'change':<{width}}{'step ms':>9}{'speedup':>9}{'won':>7}{'worst round':>13}"
        if model_s:
            head += f"{'model ms':>10}{'meas/model':>12}"
        lines = [head]
        for r in self.rows():
            won = "-" if r.name == self.baseline else f"{r.wins}/{r.rounds}"
            line = (f"{r.name:<{width}}{1e3 * r.median_s:9.1f}{r.ratio:8.2f}x{won:>7}"
                    f"{r.min_ratio:12.2f}x")  # fmt: skip
            if r.name in model_s:
                line += f"{1e3 * model_s[r.name]:10.1f}{r.median_s / model_s[r.name]:12.2f}"
            lines.append(line)
        return "\n".join(lines)

    def as_record(self) -> dict[str, dict[str, float]]:
        """``{name: {"step_ms", "speedup", "rounds_won", "rounds"}}`` for ``lk.record``."""
        return {
            r.name: {"step_ms": round(1e3 * r.median_s, 2), "speedup": round(r.ratio, 3),
                     "rounds_won": r.wins, "rounds": r.rounds}
            for r in self.rows()
        }  # fmt: skip


def measure_speedups(
    variants: Mapping[str, Callable[[], Any]],
    baseline: str | None = None,
    rounds: int = 5,
    warmup: int = 1,
    before: Callable[[], Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    device: Any = None,
) -> SpeedupTable:
    """Time a baseline and each variant in interleaved rounds of the same run.

    Each round calls every variant once; round i starts with variant ``i mod n`` and goes
    on in order, so no variant always runs first (or right after the same neighbour). The
    first ``warmup`` rounds are run and not kept. Run it on every rank of a data-parallel
    job with ``before=dist.barrier`` so the ranks start each call together, and merge the
    ranks with ``SpeedupTable.slowest_rank``.

    Args:
        variants: name → a function to time (e.g. one training step or one short epoch).
        baseline: the name the others are compared with (default: the first).
        rounds: rounds kept (≥ 1).
        warmup: rounds run first and discarded (≥ 0).
        before: called before each timed call, outside the timing (e.g. a barrier).
        clock: seconds, monotonic.
        device: where the variants compute (``lk.get_device()``); on a GPU each call is
            timed from a synchronised device to a synchronised device (``sync_device``).

    Returns:
        SpeedupTable.

    Raises:
        ValueError: no variants, an unknown baseline, ``rounds < 1`` or ``warmup < 0``.
    """
    names = list(variants)
    if not names:
        raise ValueError("measure_speedups needs at least one variant")
    baseline = names[0] if baseline is None else baseline
    if baseline not in variants:
        raise ValueError(f"baseline {baseline!r} is not one of {names}")
    if rounds < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1 and warmup >= 0, got {rounds}, {warmup}")
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(warmup + rounds):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            if before is not None:
                before()
            sync_device(device)
            start = clock()
            variants[name]()
            sync_device(device)
            elapsed = clock() - start
            if i >= warmup:
                times[name].append(elapsed)
    return SpeedupTable(baseline, times)
