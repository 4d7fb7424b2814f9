"""Exercises of notebooks/16_performance_tuning.ipynb.

Introduced in notebooks/16_performance_tuning.ipynb.

``16_speedup_ratios``: from per-round times of a baseline and its variants (measured in
interleaved rounds of one run), compute each variant's speedup as the ratio of medians
``median(baseline) / median(variant)`` and the number of rounds it won, the rounds i where
``baseline[i] > variant[i]`` (paired: round i of both ran back to back). The checker is pure
arithmetic: it compares with ``lk.profile.SpeedupTable`` on hand-made cases chosen so that
means, minima, inverted ratios or unpaired comparisons give different answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from labkit.exercises import ExerciseFailed, exercise
from labkit.profile.speedup import SpeedupTable

PROMPT = """Write `my_speedups(times, baseline)`: `times` maps each variant's name to its
seconds per round (round i of every variant ran in the same round); return a dict mapping
every name (the baseline too) to `(speedup, wins)`: speedup = median of the baseline's times /
median of the variant's; wins = the number of rounds i with baseline[i] > variant[i]."""

# Rounds disturbed by another process (an outlier), even and odd numbers of rounds, a
# variant that loses, and one that wins on medians but not in every round.
CASES: tuple[tuple[str, dict[str, tuple[float, ...]]], ...] = (
    ("base", {"base": (0.10, 0.11, 0.30), "fast": (0.05, 0.06, 0.02)}),
    ("base", {"base": (2.0, 2.2, 1.9, 2.1), "half": (1.0, 1.2, 0.9, 5.0), "slow": (3, 3, 3, 2)}),
    ("a", {"b": (0.4, 0.5, 0.45), "a": (1.0, 0.9, 1.1), "c": (0.95, 1.2, 0.5)}),
    ("x", {"x": (7.0,), "y": (3.5,)}),
    ("base", {"base": (1.0, 3.0, 1.0), "v": (2.0, 2.5, 0.9)}),
)
REL_TOL = 1e-9


def reference_speedups(
    times: Mapping[str, Sequence[float]], baseline: str
) -> dict[str, tuple[float, float]]:
    """Each name's (ratio of medians vs ``baseline``, rounds where it beat the baseline).

    Reference solution of exercise ``16_speedup_ratios``; the rows of
    ``lk.profile.SpeedupTable``.

    Introduced in notebooks/16_performance_tuning.ipynb.

    Args:
        times: name → seconds per round, the same rounds for every name.
        baseline: the name the others are compared with.

    Returns:
        dict: name → ``(speedup, wins)``.
    """
    table = SpeedupTable(baseline, times)
    return {r.name: (r.ratio, r.wins) for r in table.rows()}


def _close(a: Any, b: float) -> bool:
    return isinstance(a, (int, float)) and math.isclose(a, b, rel_tol=REL_TOL)


@exercise("16_speedup_ratios", reference=reference_speedups, prompt=PROMPT)
def check_speedup_ratios(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a speedup table: ratio of medians and rounds won, per variant.

    Introduced in notebooks/16_performance_tuning.ipynb.

    Args:
        fn: the learner's ``fn(times, baseline)``.

    Returns:
        ``{"cases": n, "speedups": [...]}``: the expected answers checked.

    Raises:
        ExerciseFailed: a missing name, or a speedup or a count of wins that differs; the
            message gives the case and both answers.
        NotImplementedError: not attempted yet (``check`` then runs the reference).
    """
    answers = []
    for baseline, times in CASES:
        want = reference_speedups(times, baseline)
        try:
            got = fn({k: list(v) for k, v in times.items()}, baseline)
        except NotImplementedError:
            raise
        except Exception as exc:  # a learner's bug: report it as a failed check
            raise ExerciseFailed(f"my_speedups raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(got, Mapping) or set(got) != set(want):
            names = sorted(got) if isinstance(got, Mapping) else type(got).__name__
            raise ExerciseFailed(f"return one entry per name {sorted(want)}, got {names}")
        for name, (ratio, wins) in want.items():
            pair = got[name]
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                raise ExerciseFailed(f"{name!r}: return (speedup, wins), got {pair!r}")
            where = f"baseline {baseline!r}, times {times}"
            if not _close(pair[0], ratio):
                hint = (
                    " (that is variant/baseline: invert it)" if _close(pair[0], 1 / ratio) else ""
                )
                raise ExerciseFailed(
                    f"speedup of {name!r} should be {ratio:.4g} = median(baseline) / "
                    f"median({name}), got {pair[0]!r}{hint} — {where}"
                )
            if pair[1] != wins or isinstance(pair[1], bool):
                raise ExerciseFailed(
                    f"{name!r} won {wins} round(s): count the rounds i with baseline[i] > "
                    f"{name}[i] (paired, same round), got {pair[1]!r} — {where}"
                )
        answers.append({k: [round(v[0], 6), v[1]] for k, v in want.items()})
    return {"cases": len(CASES), "speedups": answers}
