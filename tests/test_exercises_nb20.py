"""Tests for labkit/exercises/nb20.py: exposed communication per rank and the straggler."""

from __future__ import annotations

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb20

NAME = "20_exposed_comm"


def _union(iv):
    total, end = 0, None
    for a, b in sorted(iv):
        start = a if end is None else max(a, end)
        total += max(0, b - start)
        end = b if end is None else max(end, b)
    return total


def _by_rank(spans, kind=None, rank=None):
    return [
        (s.start_ns, s.end_ns)
        for s in spans
        if (rank is None or s.rank == rank) and (kind is None or (s.kind == "comm") == kind)
    ]


def _answer(exposed_of, straggler_of=None):
    """An answer built from ``exposed_of(spans, rank)`` in ns, and a straggler rule."""

    def fn(spans):
        p = 1 + max(s.rank for s in spans)
        exposed = [exposed_of(spans, r) / 1e6 for r in range(p)]
        compute = [_union(_by_rank(spans, False, r)) for r in range(p)]
        if straggler_of is None:
            return exposed, max(range(p), key=compute.__getitem__)
        return exposed, straggler_of(exposed, compute)

    return fn


def _right(spans, r):
    comm, comp = _by_rank(spans, True, r), _by_rank(spans, False, r)
    return _union(comm + comp) - _union(comp)


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb20.exposed_comm
    detail = ex.checker(ex.reference)
    assert detail["cases"] == len(nb20.CASES)
    assert detail["answers"][0] == {"exposed_ms": [4.0, 1.0], "straggler": 1}
    assert detail["answers"][2] == {"exposed_ms": [4.0, 10.0, 1.0], "straggler": 2}


def test_a_hand_written_answer_passes(capsys) -> None:
    assert lk.exercises.check(NAME, _answer(_right)).status == "passed"
    assert "correct" in capsys.readouterr().out


def test_the_reference_agrees_with_a_profiled_timeline() -> None:
    spans = nb20.case_spans(nb20.CASES[0])
    (r0, r1) = lk.trace.Timeline.merge(
        [[s for s in spans if s.rank == r] for r in (0, 1)]
    ).summary()
    exposed, _ = nb20.exposed_comm(spans)
    assert exposed == pytest.approx([1e3 * (r.comm_s - r.overlap_s) for r in (r0, r1)])


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(spans):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _all_comm(spans, r):
    return _union(_by_rank(spans, True, r))


def _comm_spans_summed(spans, r):
    comp = _by_rank(spans, False, r)
    return sum(_union([c] + comp) - _union(comp) for c in _by_rank(spans, True, r))


def _compute_spans_subtracted_one_by_one(spans, r):
    comm = _by_rank(spans, True, r)
    total = _union(comm)
    return total - sum(
        total - (_union(comm + [c]) - _union([c])) for c in _by_rank(spans, False, r)
    )


def _hidden_by_any_rank(spans, r):
    comp = _by_rank(spans, False)
    return _union(_by_rank(spans, True, r) + comp) - _union(comp)


def _nanoseconds(spans):
    exposed, straggler = nb20.exposed_comm(spans)
    return [1e6 * x for x in exposed], straggler


def _waits_longest(exposed, compute):
    return max(range(len(exposed)), key=exposed.__getitem__)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_answer(_all_comm), "all of its communication: subtract"),
        (_answer(_comm_spans_summed), "comm spans overlap each other"),
        (_answer(_compute_spans_subtracted_one_by_one), "compute spans overlap"),
        (_answer(_hidden_by_any_rank), "another rank's compute does not hide"),
        (_nanoseconds, "return milliseconds"),
        (_answer(_right, _waits_longest), "that rank waits longest: it is the fastest"),
        (_answer(_right, lambda exposed, compute: 0), r"the straggler is rank 1 \(the most"),
        (lambda spans: nb20.exposed_comm(spans)[0], r"return \(exposed_ms, straggler\)"),
        (lambda spans: ([1.0], 0), "one number per rank"),
        (lambda spans: spans[99], "raised IndexError"),
    ],
    ids=[
        "overlap-counted",
        "comm-double-counted",
        "compute-double-subtracted",
        "other-ranks-compute",
        "nanoseconds",
        "waits-longest",
        "rank-0",
        "no-pair",
        "wrong-length",
        "bug",
    ],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
