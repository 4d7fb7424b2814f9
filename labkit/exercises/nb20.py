"""Exercises of notebooks/20_performance_tuning.ipynb.

Introduced in notebooks/20_performance_tuning.ipynb.

``20_exposed_comm``: read a data-parallel step from its per-rank spans (``lk.trace.Span``:
rank, kind ``"compute"`` or ``"comm"``, start and end in ns on one clock, as
``lk.profile.trace_spans`` makes them from each rank's profiler trace). Return each rank's
**exposed communication** — the time it communicates while it does not compute: the union of
its comm spans minus the part that its own compute spans cover — and the **straggler**, the
rank that computed longest. In a synchronous step every collective ends only when the last
rank joins it, so the other ranks' exposed communication includes waiting for the straggler,
which has the least of it. Holistic Trace Analysis (Meta's trace analyser for PyTorch
profiles) reports the same split per rank ("comm-comp overlap", and its temporal breakdown
of idle, compute and non-compute time).

The checker is pure arithmetic on hand-made steps chosen so that the usual mistakes give
different numbers: overlapped communication counted as exposed, two collectives in flight at
once (on a backend's threads) counted twice, nested compute spans subtracted twice, another
rank's compute taken to hide this rank's communication, nanoseconds returned as
milliseconds, and the rank that waits longest taken for the straggler. Its answers are
``lk.trace.Timeline``'s (``comm_s - overlap_s`` per rank); the notebook also runs the
function on its own profiled DDP step and compares with ``lk.profile.comm_compute``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

from labkit.exercises import ExerciseFailed, exercise
from labkit.trace import COMM, COMPUTE, Span, Timeline

PROMPT = """Write `my_exposed_comm(spans)`: `spans` holds one step's spans of every rank
(`lk.trace.Span` with `.rank`, `.kind` "compute" or "comm", `.start_ns`, `.end_ns`; any
order; spans of one kind may overlap). Return `(exposed_ms, straggler)`: `exposed_ms[r]` is
the milliseconds in which rank r communicates and does not compute (the union of its comm
spans minus what its own compute spans cover), and `straggler` the rank with the most compute
time (the union of its compute spans)."""

REL_TOL = 1e-9

# Each case: per rank, (kind, start_ms, end_ms) spans. Ranks compute different amounts, so
# the straggler is unambiguous; every case has overlap of some kind.
CASES: tuple[tuple[tuple[tuple[str, float, float], ...], ...], ...] = (
    (  # bucketed DDP: one bucket's all-reduce under backward, one after it
        (("compute", 0, 10), ("compute", 10, 20), ("comm", 12, 18), ("comm", 20, 24)),
        (("compute", 0, 12), ("compute", 12, 23), ("comm", 14, 19), ("comm", 23, 24)),
    ),
    (  # two all-reduces in flight at once on gloo's threads, partly under compute
        (("compute", 0, 12), ("comm", 5, 15), ("comm", 8, 20)),
        (("compute", 0, 18), ("comm", 18, 20)),
    ),
    (  # nested compute (an op inside "backward"); rank 1 waits under rank 2's compute
        (("compute", 0, 10), ("compute", 7, 10), ("comm", 8, 14)),
        (("compute", 0, 4), ("comm", 4, 14)),
        (("compute", 0, 13), ("comm", 13, 14)),
    ),
    (  # a fully hidden all-reduce, a rank that never communicates, a clock far from zero
        (("compute", 1e6, 1e6 + 9), ("comm", 1e6 + 2, 1e6 + 5)),
        (("compute", 1e6, 1e6 + 30),),
        (
            ("compute", 1e6 + 1, 1e6 + 7.5),
            ("comm", 1e6 + 7.5, 1e6 + 30),
            ("comm", 1e6 + 9, 1e6 + 12),
        ),
    ),
)


def exposed_comm(spans: Sequence[Span]) -> tuple[list[float], int]:
    """Each rank's exposed communication (ms) and the rank that computed longest.

    Reference solution of exercise ``20_exposed_comm``: ``lk.trace.Timeline``'s per-rank
    summary, ``comm_s - overlap_s``.

    Args:
        spans: one step's spans of ranks 0..p-1, on one clock.

    Returns:
        ``(exposed_ms, straggler)``: a list indexed by rank, and a rank.

    Raises:
        ValueError: no spans.
    """
    if not spans:
        raise ValueError("exposed_comm needs the spans of at least one rank")
    p = 1 + max(s.rank for s in spans)
    summary = Timeline.merge([[s for s in spans if s.rank == r] for r in range(p)]).summary()
    exposed = [1e3 * (row.comm_s - row.overlap_s) for row in summary]
    straggler = max(range(p), key=lambda r: summary[r].compute_s)
    return exposed, straggler


def case_spans(case: Sequence[Sequence[tuple[str, float, float]]], seed: int = 0) -> list[Span]:
    """A hand-made case as spans (ms → ns), shuffled: the answer must not rely on order.

    Args:
        case: per rank, ``(kind, start_ms, end_ms)`` triples.
        seed: the shuffle's seed.

    Returns:
        list[Span]: every rank's spans in one list.
    """
    spans = [
        Span(kind, COMM if kind == "comm" else COMPUTE, round(a * 1e6), round(b * 1e6), rank)
        for rank, triples in enumerate(case)
        for kind, a, b in triples
    ]
    random.Random(seed).shuffle(spans)
    return spans


def _union_ms(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        total += max(0.0, b - max(a, end))
        end = max(end, b)
    return total


def _exposed_ms(comm: list[tuple[float, float]], comp: list[tuple[float, float]]) -> float:
    """Length of the union of ``comm`` that the union of ``comp`` does not cover."""
    return _union_ms(comm + comp) - _union_ms(comp)


def _hint(case: Sequence[Sequence[tuple[str, float, float]]], r: int, got: float) -> str:
    """Name the known mistake that gives ``got`` for rank ``r`` of ``case``."""
    comm = [(a, b) for k, a, b in case[r] if k == "comm"]
    comp = [(a, b) for k, a, b in case[r] if k != "comm"]
    everyone = [(a, b) for spans in case for k, a, b in spans if k != "comm"]
    exposed, total = _exposed_ms(comm, comp), _union_ms(comm)
    known = [
        (total, "that is all of its communication: subtract what its compute covers"),
        (
            sum(_exposed_ms([c], comp) for c in comm),
            "two of its comm spans overlap each other: take the union of the comm spans first",
        ),
        (
            total - sum(total - _exposed_ms(comm, [c]) for c in comp),
            "two of its compute spans overlap (one nested in another): take the union of the "
            "compute spans before subtracting",
        ),
        (
            _exposed_ms(comm, everyone),
            "another rank's compute does not hide this rank's communication: use rank r's "
            "own compute spans only",
        ),
        (1e6 * exposed, "the spans are in nanoseconds: return milliseconds"),
    ]
    for value, words in known:
        if math.isclose(got, value, rel_tol=REL_TOL, abs_tol=1e-12):
            return words
    return "the union of its comm spans, minus the part its own compute spans cover"


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


@exercise("20_exposed_comm", reference=exposed_comm, prompt=PROMPT)
def check_exposed_comm(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check exposed communication per rank and the straggler on hand-made steps.

    Args:
        fn: the learner's ``fn(spans)``.

    Returns:
        ``{"cases": n, "answers": [...]}``: the expected answers checked.

    Raises:
        ExerciseFailed: a wrong shape of answer, a rank's exposed time or the straggler
            differs; the message gives the case, both answers and the likely mistake.
        NotImplementedError: not attempted yet (``check`` then runs the reference).
    """
    answers = []
    for i, case in enumerate(CASES):
        spans = case_spans(case, seed=i)
        want, slow = exposed_comm(spans)
        try:
            got = fn(list(spans))
        except NotImplementedError:
            raise
        except Exception as exc:  # a learner's bug: report it as a failed check
            raise ExerciseFailed(f"my_exposed_comm raised {type(exc).__name__}: {exc}") from exc
        where = f"case {i}: " + "; ".join(
            f"rank {r} {list(triples)}" for r, triples in enumerate(case)
        )
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], Sequence)):
            raise ExerciseFailed(f"return (exposed_ms, straggler), got {got!r}")
        exposed, straggler = got
        if not (isinstance(exposed, Sequence) and len(exposed) == len(want)):
            raise ExerciseFailed(
                f"exposed_ms must hold one number per rank ({len(want)}), got {exposed!r} — "
                + where
            )
        for r, (g, w) in enumerate(zip(exposed, want, strict=True)):
            if not (_number(g) and math.isclose(g, w, rel_tol=REL_TOL, abs_tol=1e-12)):
                hint = _hint(case, r, g) if _number(g) else "return a number of ms"
                raise ExerciseFailed(
                    f"rank {r}'s exposed communication is {w:g} ms, got {g!r}: {hint} — {where}"
                )
        if straggler != slow or isinstance(straggler, bool):
            waits = max(range(len(want)), key=want.__getitem__)
            hint = (
                " — that rank waits longest: it is the fastest, waiting for the slow one"
                if straggler == waits
                else ""
            )
            raise ExerciseFailed(
                f"the straggler is rank {slow} (the most compute), got {straggler!r}{hint} — "
                + where
            )
        answers.append({"exposed_ms": [round(x, 9) for x in want], "straggler": slow})
    return {"cases": len(CASES), "answers": answers}
