"""Exercises of notebooks/00_setup_and_launcher.ipynb.

Introduced in notebooks/00_setup_and_launcher.ipynb.

``00_parallel_sum``: every rank sums its own slice of 1..n, then the ranks combine their partial
sums with ``dist.all_reduce`` — the smallest data-parallel program there is. The checker runs
the learner's function on 1, 2 and 3 ranks through ``lk.launch`` for several n (including
n smaller than the number of ranks) and compares every rank's answer with Gauss's n(n+1)/2.
It also notes what each rank handed to ``dist.all_reduce``, so a wrong answer comes with the
likely mistake (every rank summed everything, a slice was lost, float32 rounded).

A right total is not enough: the ranks run on the recording backend (``labkit_record`` over
gloo), and on 2 and 3 ranks every rank must have run an all-reduce and handed it its own partial
sum — the contributions must add up to n(n+1)/2, and for the largest n each must be a proper
part of it. So ``return n * (n + 1) // 2`` (no communication), an all-reduce of zeros next to
the formula, and "rank 0 sums everything, the others add 0" are all rejected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.backends import recording
from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner

WORLD_SIZES = (1, 2, 3)  # ranks the checker launches
NS = (1, 2, 7, 10, 1000, 100_003)  # n = 1 and 2 leave some of 3 ranks an empty slice
TIMEOUT_S = 60.0  # per launch; a deadlocked answer is reported after this long

PROMPT = """Write `parallel_sum(rank, world_size, n)`: rank r sums its own slice of the
integers 1..n (the slices of all ranks cover 1..n exactly once), then the ranks add their
partial sums with `dist.all_reduce`; every rank returns the total as an int."""


def parallel_sum(rank: int, world_size: int, n: int) -> int:
    """Sum 1..n over ``world_size`` ranks: a contiguous slice per rank, then an all-reduce.

    Reference solution of exercise ``00_parallel_sum``. Rank r takes the integers
    ``r*n//p + 1 .. (r+1)*n//p`` (block distribution: slice sizes differ by at most one, and
    may be empty when n < p). int64 keeps the sum exact where float32 would round.

    Args:
        rank: this rank.
        world_size: number of ranks p.
        n: sum the integers 1..n.

    Returns:
        n(n+1)/2, on every rank.

    Raises:
        RuntimeError: from ``torch.distributed`` when no process group is initialised.
    """
    lo, hi = rank * n // world_size + 1, (rank + 1) * n // world_size  # this rank's slice
    part = torch.arange(lo, hi + 1, dtype=torch.int64).sum().reshape(1)
    dist.all_reduce(part)  # SUM of the partial sums, on every rank
    return int(part.item())


def _as_int(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return value


def _run_cases(rank: int, world_size: int, fn: Callable[..., Any]) -> list[dict]:
    """On every rank: call ``fn`` for each n, noting what it gave ``dist.all_reduce``."""
    real_all_reduce = dist.all_reduce
    seen: list[float] = []

    def watched(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(float(tensor.detach().sum().cpu()))  # this rank's contribution
        return real_all_reduce(tensor, *args, **kwargs)

    out = []
    dist.all_reduce = watched
    try:
        for n in NS:
            seen.clear()
            recording.clear()
            got = _as_int(fn(rank, world_size, n))
            ops = [r.op for r in recording.records()]  # every collective, however it was called
            out.append({"n": n, "got": got, "partials": list(seen), "ops": ops})
    finally:
        dist.all_reduce = real_all_reduce
    return out


def _hint(world_size: int, rank: int, rows: list[dict], expected: int) -> str:
    """Name the usual mistake from the answers and what each rank gave ``all_reduce``."""
    got = rows[rank]["got"]
    partials = [row["partials"][0] if row["partials"] else None for row in rows]
    if not isinstance(got, (int, float)):
        return f"Return the total as an int (got {type(got).__name__})."
    if abs(got - expected) <= 1e-6 * expected:
        return "Close but not exact: a float32 sum rounds; use an int64 tensor."
    if world_size > 1 and partials[rank] is None:
        return (
            f"Rank {rank} never called dist.all_reduce: its own partial sum is not the total; "
            "add the partial sums of all ranks with dist.all_reduce."
        )
    if None not in partials and world_size > 1 and sum(partials) == world_size * expected:
        return "Every rank summed all of 1..n: sum only this rank's slice."
    if None not in partials and sum(partials) != expected:
        return "Check the slice bounds: together the slices must cover 1..n exactly once."
    return "The partial sums are right; return their all_reduce (in place on the tensor)."


def _compare(world_size: int, results: list[list[dict]]) -> None:
    for case, n in enumerate(NS):
        rows = [r[case] for r in results]
        expected = n * (n + 1) // 2
        wrong = [rank for rank, row in enumerate(rows) if row["got"] != expected]
        if wrong:
            got = rows[wrong[0]]["got"]
            raise ExerciseFailed(
                f"on {world_size} rank(s), n={n}: rank(s) {', '.join(map(str, wrong))} "
                f"returned {got!r}, expected n(n+1)/2 = {expected}. "
                + _hint(world_size, wrong[0], rows, expected)
            )


def _check_communication(world_size: int, results: list[list[dict]]) -> None:
    """Right totals must come from an all-reduce of each rank's own partial sum."""
    if world_size == 1:
        return  # one rank's partial sum is the total; nothing to communicate
    for case, n in enumerate(NS):
        rows = [r[case] for r in results]
        expected = n * (n + 1) // 2
        where = f"on {world_size} ranks, n={n}"
        silent = [rank for rank, row in enumerate(rows) if "all_reduce" not in row["ops"]]
        if silent:
            ran = sorted({op for row in rows for op in row["ops"]}) or ["no collective at all"]
            raise ExerciseFailed(
                f"{where}: rank(s) {', '.join(map(str, silent))} returned {expected} without "
                f"an all-reduce (the backend recorded: {', '.join(ran)}). Computing n(n+1)/2 "
                "on every rank is not a parallel sum: sum only this rank's slice and add the "
                "partial sums of all ranks with dist.all_reduce."
            )
        unseen = [rank for rank, row in enumerate(rows) if not row["partials"]]
        if unseen:
            raise ExerciseFailed(
                f"{where}: rank(s) {', '.join(map(str, unseen))} all-reduced without calling "
                "dist.all_reduce, so the checker cannot see what they contributed: call "
                "dist.all_reduce(partial) on each rank's partial sum."
            )
        partials = [row["partials"][0] for row in rows]
        if sum(partials) != expected:
            raise ExerciseFailed(
                f"{where}: the ranks handed dist.all_reduce {partials}, which add up to "
                f"{sum(partials):.15g}, not n(n+1)/2 = {expected}, yet returned {expected}: the "
                "total must be the all-reduce of the partial sums, each rank contributing the "
                "sum of its own slice."
            )
        if n == max(NS):
            lazy = [rank for rank, part in enumerate(partials) if not 0 < part < expected]
            if lazy:
                raise ExerciseFailed(
                    f"{where}: rank(s) {', '.join(map(str, lazy))} contributed "
                    f"{', '.join(f'{partials[r]:.15g}' for r in lazy)} of {expected}: every rank "
                    "must sum its own part of 1..n (for n much larger than the number of "
                    "ranks, no rank's slice is empty and none is everything)."
                )


@exercise("00_parallel_sum", reference=parallel_sum, prompt=PROMPT)
def check_parallel_sum(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a parallel sum of 1..n on 1, 2 and 3 ranks against n(n+1)/2.

    Args:
        fn: the learner's ``fn(rank, world_size, n)`` returning the total on every rank.

    Returns:
        ``{"world_sizes": [...], "ns": [...]}``: what was checked.

    Raises:
        ExerciseFailed: a rank's total is wrong; on several ranks, a rank ran no all-reduce or
            the partial sums it was given do not add up to the total; or the function raised
            or hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for world_size in WORLD_SIZES:
        results = launch_learner(
            _run_cases,
            world_size,
            backend=recording.spec("gloo"),  # gloo runs everywhere; we see every op
            args=(fn,),
            timeout_s=TIMEOUT_S,
            hang="Every rank must call dist.all_reduce the same number of times.",
            ranks="rank(s)",
        )
        _compare(world_size, results)
        _check_communication(world_size, results)
    return {"world_sizes": list(WORLD_SIZES), "ns": list(NS)}
