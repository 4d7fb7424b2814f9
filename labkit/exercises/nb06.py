"""Exercises of notebooks/06_data_parallel.ipynb.

Introduced in notebooks/06_data_parallel.ipynb.

``06_average_gradients``: the heart of data parallelism — after ``loss.backward()`` on this
rank's shard, make every parameter's ``.grad`` the average over ranks (one all-reduce per
parameter, then divide by the world size; Li et al. 2020, "PyTorch Distributed", §3.1). The
checker runs the learner's function on 2 and 3 ranks through ``lk.launch``: each rank takes
its own slice of a batch, and every rank's gradients must equal those of one process that
computes the loss on the whole batch. Then on 4 ranks split into the groups ``GROUPS``, each
rank passing its own group: every rank's gradients must be the average over its group only —
an answer that ignores ``group`` and averages over the world fails there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner

WORLD_SIZES = (2, 3)  # ranks the checker launches with the default group
GROUPS = ((0, 2), (1, 3))  # then 4 ranks in two groups: each averages over its own
TIMEOUT_S = 60.0  # per launch; a deadlocked answer is reported after this long
PER_RANK = 4  # samples per rank
RTOL, ATOL = 1e-5, 1e-6  # float32 sums in another order

PROMPT = """Write `average_gradients(model, group=None)`: after `loss.backward()`, replace every
parameter's `.grad` by the average of that gradient over the ranks of `group`, in place
(`dist.all_reduce` sums; then divide by the group's world size)."""


def average_gradients(model: nn.Module, group: dist.ProcessGroup | None = None) -> None:
    """Average every parameter's gradient over the group: one all-reduce per parameter.

    Reference solution of exercise ``06_average_gradients``, and the core of
    ``lk.parallel.ddp.DataParallelNaive`` (Li et al. 2020, §3.1: all-reducing gradients makes
    every replica take the step one process would take on the whole batch).

    Args:
        model: the replica on this rank, after ``loss.backward()``.
        group: the data-parallel group (None: the default group).

    Returns:
        None; every ``.grad`` holds the average afterwards.

    Raises:
        RuntimeError: from ``torch.distributed`` when the group is not initialised.
    """
    world_size = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world_size


def _model() -> nn.Module:
    from labkit.models import MLP

    return MLP(in_features=8, hidden=(16,), out_features=3, seed=0)


def _batch(world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(6)
    n = PER_RANK * world_size
    return torch.randn(n, 8, generator=g), torch.randint(0, 3, (n,), generator=g)


def _shard(rank: int) -> slice:
    return slice(rank * PER_RANK, (rank + 1) * PER_RANK)


def _run(
    rank: int, world_size: int, fn: Callable[..., Any], groups: tuple[tuple[int, ...], ...] = ()
) -> dict[str, Any]:
    x, y = _batch(world_size)
    # Every rank creates every group, in the same order (dist.new_group is collective).
    made = [(ranks, dist.new_group(list(ranks))) for ranks in groups]
    mine = next((g for ranks, g in made if rank in ranks), None)
    model = _model()
    nn.functional.cross_entropy(model(x[_shard(rank)]), y[_shard(rank)]).backward()
    local = {n: p.grad.clone() for n, p in model.named_parameters()}
    if groups:
        fn(model, group=mine)
    else:
        fn(model)
    got = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    return {"local": local, "got": got}


def _reference(world_size: int, ranks: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """One process, the loss on the samples of ``ranks`` together."""
    x, y = _batch(world_size)
    rows = torch.cat([torch.arange(world_size * PER_RANK)[_shard(r)] for r in ranks])
    model = _model()
    nn.functional.cross_entropy(model(x[rows]), y[rows]).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _hint(got: torch.Tensor, want: torch.Tensor, res: dict, name: str, case: dict) -> str:
    n = len(case["ranks"])
    if torch.allclose(got, res["local"][name], rtol=RTOL, atol=ATOL):
        return "It still holds this rank's own gradient: all-reduce it across the ranks."
    if torch.allclose(got, want * n, rtol=RTOL, atol=ATOL):
        return (
            f"It is {n}× the average: the all-reduce sums; divide by the world size "
            "(of the group: dist.get_world_size(group))."
        )
    if n != case["world_size"] and torch.allclose(
        got, want * n / case["world_size"], rtol=RTOL, atol=ATOL
    ):
        return (
            f"It is the group's sum divided by the world's size {case['world_size']}: divide by "
            f"the group's size {n}, dist.get_world_size(group)."
        )
    world = case["world_mean"][name]
    if world is not None and torch.allclose(got, world, rtol=RTOL, atol=ATOL):
        return (
            f"It is the average over all {case['world_size']} ranks, not over this rank's group "
            f"{list(case['ranks'])}: pass group= to dist.all_reduce and dist.get_world_size."
        )
    return "Compare it with the average of the group's gradients."


def _compare(world_size: int, results: list[dict[str, Any]], groups: tuple = ()) -> None:
    where = f"on {world_size} ranks" + (f" in groups {[list(g) for g in groups]}" if groups else "")
    world_mean = {
        n: torch.stack([r["local"][n] for r in results]).mean(0) if groups else None
        for n in results[0]["local"]
    }
    for ranks in groups or (tuple(range(world_size)),):
        want = _reference(world_size, ranks)
        case = {"ranks": ranks, "world_size": world_size, "world_mean": world_mean}
        for rank in ranks:
            res = results[rank]
            for name, ref in want.items():
                got = res["got"][name]
                if got is None:
                    raise ExerciseFailed(
                        f"{where}, rank {rank}: {name}.grad is None afterwards; "
                        "average the gradients in place (keep .grad)"
                    )
                if not torch.allclose(got, ref, rtol=RTOL, atol=ATOL):
                    hint = _hint(got, ref, res, name, case)
                    err = (got - ref).abs().max().item()
                    raise ExerciseFailed(
                        f"{where}, rank {rank}: {name}.grad differs from the gradient of one "
                        f"process on its group's whole batch (max |Δ| = {err:.3g}). {hint}"
                    )


def _launch_checked(fn: Callable[..., Any], world_size: int, groups: tuple = ()) -> list:
    return launch_learner(
        _run,
        world_size,
        backend="gloo",
        args=(fn, groups),
        timeout_s=TIMEOUT_S,
        hang="Every rank must all-reduce the same parameters in the same order, over the group "
        "it is given.",
    )


@exercise("06_average_gradients", reference=average_gradients, prompt=PROMPT)
def check_average_gradients(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a gradient-averaging function against one process on the whole batch.

    Args:
        fn: the learner's ``fn(model, group=None)``, averaging gradients in place.

    Returns:
        ``{"world_sizes": [...], "groups": [[...], ...], "parameters": n}``: the worlds, the
        subgroups of the 4-rank check and the parameters checked.

    Raises:
        ExerciseFailed: a rank's gradient differs from the whole-batch gradient of its group
            (the world, or its subgroup), the function raised, or it hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for world_size in WORLD_SIZES:
        _compare(world_size, _launch_checked(fn, world_size))
    n_ranks = 1 + max(r for g in GROUPS for r in g)
    _compare(n_ranks, _launch_checked(fn, n_ranks, GROUPS), GROUPS)
    return {
        "world_sizes": list(WORLD_SIZES),
        "groups": [list(g) for g in GROUPS],
        "parameters": len(list(_model().parameters())),
    }
