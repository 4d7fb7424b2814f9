"""Tests for labkit/exercises/nb16.py: the reference passes, wrong speedup tables fail."""

from __future__ import annotations

import statistics

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb16

NAME = "16_speedup_ratios"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb16.reference_speedups
    detail = ex.checker(ex.reference)
    assert detail["cases"] == len(nb16.CASES)
    assert detail["speedups"][0] == {"base": [1.0, 0], "fast": [2.2, 3]}


def test_a_hand_written_answer_passes() -> None:
    def mine(times, baseline):
        base = times[baseline]
        return {
            name: (
                statistics.median(base) / statistics.median(ts),
                sum(b > t for b, t in zip(base, ts, strict=True)),
            )
            for name, ts in times.items()
        }

    assert lk.exercises.check(NAME, mine).status == "passed"


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(times, baseline):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _answer(ratio, wins):
    def fn(times, baseline):
        return {
            n: (ratio(times[baseline], ts), wins(times[baseline], ts)) for n, ts in times.items()
        }

    return fn


def _med(b, t):
    return statistics.median(b) / statistics.median(t)


def _paired(b, t):
    return sum(x > y for x, y in zip(b, t, strict=True))


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_answer(lambda b, t: statistics.mean(b) / statistics.mean(t), _paired), "median"),
        (_answer(lambda b, t: min(b) / min(t), _paired), "median"),
        (_answer(lambda b, t: statistics.median(t) / statistics.median(b), _paired), "invert"),
        (_answer(_med, lambda b, t: sum(y < statistics.median(b) for y in t)), "paired"),
        (_answer(_med, lambda b, t: sum(x >= y for x, y in zip(b, t, strict=True))), "won 0 round"),
        (lambda times, baseline: {n: (1.0, 0) for n in times if n != baseline}, "one entry"),
        (lambda times, baseline: {n: 1.0 for n in times}, r"return \(speedup, wins\)"),
        (lambda times, baseline: times[baseline][5], "raised IndexError"),
    ],
    ids=["mean", "min", "inverted", "unpaired", "ties-count", "no-baseline", "no-pair", "bug"],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
