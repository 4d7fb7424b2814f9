"""Exercises of notebooks/18_hybrid_parallel.ipynb.

Introduced in notebooks/18_hybrid_parallel.ipynb.

``18_mesh_groups``: which ranks form each group of a dp × pp × tp mesh. The ranks are laid out
row-major with tp innermost (``init_device_mesh``'s layout for the shape (dp, pp, tp)), so rank
r sits at ``dp_rank = r // (pp·tp)``, ``pp_rank = (r // tp) % pp``, ``tp_rank = r % tp``; a
group of an axis is the ranks that differ only in that axis's coordinate. The checker compares
the learner's groups with ``labkit.mesh.ParallelDims.group_ranks`` (itself tested against
``init_device_mesh``'s own groups) on several meshes and names what went wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.exercises import ExerciseFailed, exercise
from labkit.mesh import ParallelDims

# (dp, pp, tp) meshes checked: 2-D and 3-D, non-square, and one with a degree-1 axis.
SHAPES = ((2, 1, 2), (2, 2, 1), (1, 2, 2), (2, 2, 2), (3, 2, 1), (2, 3, 4))
AXES = ("dp", "pp", "tp")

PROMPT = """Write `mesh_groups(dp, pp, tp, axis)` returning the groups of `axis` ("dp", "pp" or
"tp") as a list of lists of global ranks. Ranks fill the mesh row-major with tp innermost: rank
r has coordinates (r // (pp*tp), (r // tp) % pp, r % tp). A group of an axis holds the ranks
whose other two coordinates are equal."""


def mesh_groups(dp: int, pp: int, tp: int, axis: str) -> list[list[int]]:
    """The groups of ``axis`` in a row-major dp × pp × tp mesh (reference of ``18_mesh_groups``).

    ``lk.mesh.ParallelDims.group_ranks`` computes the same.

    Args:
        dp: data-parallel degree.
        pp: pipeline-parallel degree.
        tp: tensor-parallel degree.
        axis: ``"dp"``, ``"pp"`` or ``"tp"``.

    Returns:
        One list of global ranks per group.

    Raises:
        ValueError: an unknown axis.
    """
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; axes: {AXES}")
    groups: dict[tuple[int, ...], list[int]] = {}
    for r in range(dp * pp * tp):
        coords = {"dp": r // (pp * tp), "pp": (r // tp) % pp, "tp": r % tp}
        key = tuple(coords[a] for a in AXES if a != axis)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def _normal(groups: Any) -> list[list[int]] | None:
    try:
        return sorted(sorted(int(r) for r in g) for g in groups)
    except TypeError:
        return None


def _hint(dp: int, pp: int, tp: int, axis: str, got: list[list[int]]) -> str:
    degree = {"dp": dp, "pp": pp, "tp": tp}[axis]
    n = dp * pp * tp
    if sorted(r for g in got for r in g) != list(range(n)):
        return f"every rank 0..{n - 1} must appear in exactly one group."
    if any(len(g) != degree for g in got):
        return (
            f"a {axis} group has {degree} ranks (the {axis} degree), and there are "
            f"{n // degree} groups; a group is the ranks that differ only in their {axis} "
            "coordinate."
        )
    hints = []
    shared = {}  # the ranks that share the axis coordinate: what a group is not
    for r in range(n):
        shared.setdefault(ParallelDims(dp, pp, tp).coordinates(r)[axis], []).append(r)
    if got == _normal(shared.values()):
        hints.append(
            f"these are the ranks with the same {axis} coordinate; a {axis} group is the ranks "
            f"whose other coordinates are equal (they differ only in {axis})."
        )
    flipped = ParallelDims(tp, pp, dp)  # the same mesh laid out with dp innermost
    rename = {"dp": "tp", "pp": "pp", "tp": "dp"}
    if got == _normal(flipped.group_ranks(rename[axis])):
        hints.append("tp is the innermost axis: consecutive ranks share dp and pp, not tp.")
    return " Or: ".join(hints) or "rank r has coordinates (r // (pp·tp), (r // tp) % pp, r % tp)."


@exercise("18_mesh_groups", reference=mesh_groups, prompt=PROMPT)
def check_mesh_groups(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check the learner's groups against ``ParallelDims.group_ranks`` on several meshes.

    Args:
        fn: the learner's ``fn(dp, pp, tp, axis)``.

    Returns:
        ``{"shapes": [...], "axes": [...]}``: what was checked.

    Raises:
        ExerciseFailed: a group differs (the message says how), or the result is not a list
            of lists of ranks.
        NotImplementedError: from the learner's function (not attempted yet).
    """
    for dp, pp, tp in SHAPES:
        dims = ParallelDims(dp, pp, tp)
        for axis in AXES:
            got = _normal(fn(dp, pp, tp, axis))
            want = dims.group_ranks(axis)
            if got is None:
                raise ExerciseFailed(
                    f"mesh_groups({dp}, {pp}, {tp}, {axis!r}) must return a list of lists of ranks"
                )
            if got != want:
                raise ExerciseFailed(
                    f"the {axis} groups of a dp={dp} × pp={pp} × tp={tp} mesh are {want}, "
                    f"got {got}: " + _hint(dp, pp, tp, axis, got)
                )
    return {"shapes": list(SHAPES), "axes": list(AXES)}
