"""Exercises of notebooks/02_collectives.ipynb.

Introduced in notebooks/02_collectives.ipynb.

``02_allreduce_from_parts``: build a SUM all-reduce from ``dist.reduce`` and ``dist.broadcast``
(the "reduce + broadcast" algorithm of Thakur, Rabenseifner and Gropp 2005, §4; notebook 03
builds the faster ones). The checker runs the learner's function on 2 and 3 ranks through
``lk.launch``, on the default group and on a subgroup that leaves rank 0 out, and compares
every rank's tensor with ``dist.all_reduce`` on the same input. The ranks run on the recording
backend (``labkit_record`` over gloo), so any other collective the answer runs — an all_gather
followed by a local sum, a reduce_scatter + all_gather — is seen and rejected, however it was
called; ``dist.all_reduce`` itself is switched off inside the answer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from labkit.backends import recording
from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import RANK_FAILED, launch_learner

WORLD_SIZES = (2, 3)  # ranks the checker launches
TIMEOUT_S = 60.0  # per launch; a deadlocked answer is reported after this long
_SHAPE = (3, 4)  # a 2-D tensor: the answer must not assume 1-D inputs
_FORBIDDEN = ("all_reduce",)  # what the answer must build, not call
ALLOWED_OPS = ("reduce", "broadcast")  # the only collectives the answer may run

PROMPT = """Write `my_all_reduce(tensor, group=None)`: a SUM all-reduce of `tensor`, in place,
using only `dist.reduce` (to the group's first rank) and `dist.broadcast` (from it).
It must work on any group: give the root as a group-local rank (`group_dst=0`,
`group_src=0`), because global rank 0 need not belong to `group`."""


def allreduce_from_parts(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """All-reduce (SUM) ``tensor`` in place: reduce to the group's rank 0, then broadcast.

    Reference solution of exercise ``02_allreduce_from_parts``. The root receives p−1 tensors
    and sends p−1 (a bottleneck the ring all-reduce of notebook 03 removes); see Thakur,
    Rabenseifner and Gropp 2005, §4.

    Args:
        tensor: this rank's contribution; holds the sum over the group's ranks afterwards.
        group: the process group (default: the default group).

    Returns:
        None; ``tensor`` is modified in place, like ``dist.all_reduce``.

    Raises:
        RuntimeError: from ``torch.distributed`` when the group is not initialised.
    """
    dist.reduce(tensor, group=group, group_dst=0)  # group-local rank 0: works in any group
    dist.broadcast(tensor, group=group, group_src=0)


@contextmanager
def _forbid(names: tuple[str, ...]) -> Iterator[None]:
    saved = {name: getattr(dist, name) for name in names}

    def refuse(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise ExerciseFailed(
                f"dist.{name} is what this exercise builds, so it is switched off here: "
                "use dist.reduce and dist.broadcast"
            )

        return call

    for name in names:
        setattr(dist, name, refuse(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _input(rank: int) -> torch.Tensor:
    # Integer values: sums are exact in any order, so any correct algorithm matches exactly.
    gen = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-50, 50, _SHAPE, generator=gen).to(torch.float32)


def _run_cases(rank: int, world_size: int, fn: Callable[..., Any]) -> list[dict | None]:
    """On every rank: run ``fn`` on the default group and on ranks 1..p-1 (when p ≥ 3)."""
    cases: list[tuple[str, dist.ProcessGroup | None, list[int]]] = [
        ("the default group", None, list(range(world_size)))
    ]
    if world_size >= 3:
        members = list(range(1, world_size))
        sub = dist.new_group(members)  # every rank must call new_group, members or not
        cases.append((f"group=dist.new_group({members})", sub, members))
    out: list[dict | None] = []
    for label, group, members in cases:
        if rank not in members:
            out.append(None)
            continue
        x = _input(rank)
        expected = x.clone()
        dist.all_reduce(expected, group=group)
        got = x.clone()
        recording.clear()
        with _forbid(_FORBIDDEN):
            returned = fn(got) if group is None else fn(got, group=group)
        ops = [r.op for r in recording.records()]  # what the answer really ran
        out.append(
            {
                "label": label,
                "members": members,
                "input": x,
                "got": got,
                "expected": expected,
                "returned": returned if isinstance(returned, torch.Tensor) else None,
                "ops": ops,
            }
        )
    return out


def _hint(rows: list[dict]) -> str:
    """Name the usual mistake from the pattern of wrong ranks (rows in group-rank order)."""
    root_ok = torch.equal(rows[0]["got"], rows[0]["expected"])
    if all(torch.equal(r["got"], r["input"]) for r in rows):
        return "No rank's tensor changed: like dist.all_reduce, the function works in place."
    if all(torch.equal(r["got"], rows[0]["input"]) for r in rows):
        return "Every rank holds the root's input: reduce to the root before broadcasting."
    if root_ok:
        return "Only the root holds the sum: broadcast it from the root to the others."
    return "Compare each rank's tensor with the sum of all ranks' inputs."


def _first_difference(got: torch.Tensor, expected: torch.Tensor) -> str:
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return (
            f"got a {got.dtype} tensor of shape {tuple(got.shape)}, expected "
            f"{expected.dtype} {tuple(expected.shape)}"
        )
    bad = (got != expected).nonzero()
    idx = tuple(bad[0].tolist())
    return (
        f"{len(bad)} of {got.numel()} elements differ, first at index {idx}: "
        f"got {got[idx].item():g}, expected {expected[idx].item():g}"
    )


def _check_ops(world_size: int, rows: list[dict]) -> None:
    """Reject any collective but reduce and broadcast, whatever the values came out as."""
    for rank, row in zip(rows[0]["members"], rows, strict=True):
        other = [op for op in row["ops"] if op not in ALLOWED_OPS]
        if other:
            raise ExerciseFailed(
                f"on {world_size} ranks ({row['label']}), rank {rank} ran "
                f"{', '.join(dict.fromkeys(other))} (the backend recorded: "
                f"{', '.join(row['ops'])}). This exercise builds all_reduce from "
                "dist.reduce and dist.broadcast only: reduce to the group's first rank, then "
                "broadcast from it."
            )


def _compare(world_size: int, results: list[list[dict | None]]) -> None:
    for case in range(len(results[0])):
        rows = [r[case] for r in results if r[case] is not None]
        _check_ops(world_size, rows)
        wrong = [
            (rank, row)
            for rank, row in zip(rows[0]["members"], rows, strict=True)
            if not torch.equal(row["got"], row["expected"])
        ]
        if not wrong:
            continue
        rank, row = wrong[0]
        if row["returned"] is not None and torch.equal(row["returned"], row["expected"]):
            raise ExerciseFailed(
                f"on {world_size} ranks ({row['label']}), the function returned the sum but "
                "left `tensor` unchanged: write the result into it (tensor.copy_(...)), like "
                "dist.all_reduce does"
            )
        detail = _first_difference(row["got"], row["expected"])
        ranks = ", ".join(str(r) for r, _ in wrong)
        raise ExerciseFailed(
            f"on {world_size} ranks ({row['label']}), rank(s) {ranks} do not hold the sum of "
            f"all inputs. Rank {rank}: {detail}. {_hint(rows)}"
        )


def _group_rank_hint(cause: str) -> str:
    if "is not part of group" not in cause:
        return ""
    return (
        " Inside a group, name the root by its group rank: "
        "dist.reduce(..., group=group, group_dst=0) and "
        "dist.broadcast(..., group=group, group_src=0)."
    )


@exercise("02_allreduce_from_parts", reference=allreduce_from_parts, prompt=PROMPT)
def check_allreduce_from_parts(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check an all-reduce built from reduce + broadcast against ``dist.all_reduce``.

    Args:
        fn: the learner's ``fn(tensor, group=None)``, a SUM all-reduce in place.

    Returns:
        ``{"world_sizes": [...], "cases": n}``: the worlds and the (world, group) cases checked.

    Raises:
        ExerciseFailed: a rank's tensor differs from ``dist.all_reduce``, the function ran a
            collective other than reduce and broadcast (``dist.all_reduce`` among them),
            raised, or hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    cases = 0
    for world_size in WORLD_SIZES:
        results = launch_learner(
            _run_cases,
            world_size,
            backend=recording.spec("gloo"),  # gloo runs everywhere; we see every op
            args=(fn,),
            timeout_s=TIMEOUT_S,
            hang="Every rank of the group must make the same collective calls in the same order "
            "(reduce, then broadcast), with the same root.",
            failed=RANK_FAILED + ".",
            hint=_group_rank_hint,
        )
        _compare(world_size, results)
        cases += len(results[0])
    return {"world_sizes": list(WORLD_SIZES), "cases": cases}
