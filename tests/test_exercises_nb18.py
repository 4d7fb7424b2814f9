"""Tests for labkit/exercises/nb18.py: the reference passes, wrong mesh groups fail."""

from __future__ import annotations

import pytest

import labkit as lk
from labkit.exercises import ExerciseFailed, nb18

NAME = "18_mesh_groups"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb18.mesh_groups
    assert ex.checker(ex.reference) == {"shapes": list(nb18.SHAPES), "axes": list(nb18.AXES)}
    assert nb18.mesh_groups(2, 1, 2, "tp") == [[0, 1], [2, 3]]
    assert nb18.mesh_groups(2, 1, 2, "dp") == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="unknown axis"):
        nb18.mesh_groups(2, 1, 2, "ep")


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(dp, pp, tp, axis):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _dp_innermost(dp, pp, tp, axis):
    groups = {}
    for r in range(dp * pp * tp):
        c = {"dp": r % dp, "pp": (r // dp) % pp, "tp": r // (dp * pp)}
        groups.setdefault(tuple(v for a, v in c.items() if a != axis), []).append(r)
    return list(groups.values())


def _same_coordinate(dp, pp, tp, axis):
    # the ranks that share the axis coordinate: the complement of a group
    groups = {}
    for r in range(dp * pp * tp):
        c = {"dp": r // (pp * tp), "pp": (r // tp) % pp, "tp": r % tp}
        groups.setdefault(c[axis], []).append(r)
    return list(groups.values())


def _consecutive(dp, pp, tp, axis):
    degree = {"dp": dp, "pp": pp, "tp": tp}[axis]
    n = dp * pp * tp
    return [list(range(s, s + degree)) for s in range(0, n, degree)]


def _swapped_pp_tp(dp, pp, tp, axis):
    return nb18.mesh_groups(dp, tp, pp, {"pp": "tp", "tp": "pp"}.get(axis, axis))


def _missing_ranks(dp, pp, tp, axis):
    return nb18.mesh_groups(dp, pp, tp, axis)[:-1]


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_dp_innermost, "tp is the innermost axis"),
        (_same_coordinate, "same dp coordinate"),
        (_consecutive, "tp is the innermost axis"),
        (_missing_ranks, "exactly one group"),
        (_swapped_pp_tp, r"pp groups of a dp=1 × pp=2 × tp=2 mesh are \[\[0, 2\], \[1, 3\]\]"),
        (lambda dp, pp, tp, axis: 3, "list of lists"),
    ],
    ids=[
        "dp-innermost",
        "same-coordinate",
        "consecutive",
        "missing",
        "pp-tp-swapped",
        "not-a-list",
    ],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)
