"""Exercises of notebooks/08_sync_vs_async.ipynb.

Introduced in notebooks/08_sync_vs_async.ipynb.

``08_apply_gradient``: write the parameter server's step — apply a pushed gradient to the
server's parameters in place and measure its staleness (server version − the version the
gradient was computed on; Lian et al. 2015). The checker tries it on known numbers in this
process, then plugs it into ``lk.parallel.async_sgd.parameter_server``: with one worker the run
must equal sequential SGD bit for bit with staleness 0; with two workers every staleness must
be ≥ 0 and the versions must count 1, 2, 3, ...

``08_average_parameters``: write local SGD's averaging step (Stich 2019, Algorithm 1). The
checker runs it on 3 ranks holding different parameters (every rank must end with their mean),
then on 4 ranks split into the groups ``GROUPS``, each rank passing its own group (every rank
must end with its group's mean: an answer that ignores ``group`` averages the world and
fails), then plugs it into ``local_sgd`` with H = 1, which must give sync SGD's parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner
from labkit.parallel.async_sgd import (
    apply_gradient,
    average_parameters,
    local_sgd,
    parameter_server,
    reference_sgd,
    regression_problem,
    sync_sgd,
)

TIMEOUT_S = 60.0  # per launch; a correct answer takes a second
UPDATES = 8
GROUPS = ((0, 2), (1, 3))  # the averaging check on 4 ranks: each rank averages over its own

APPLY_PROMPT = """Write `my_apply_gradient(theta, version, grad, grad_version, lr)`: the server's
step. Update `theta` in place (θ ← θ − lr·g) and return `(new_version, staleness)` where
new_version = version + 1 and staleness = version − grad_version (measured before counting
this update)."""

AVERAGE_PROMPT = """Write `my_average_parameters(theta, group=None)`: replace `theta` on every
rank, in place, by the mean of all ranks' `theta` (one all_reduce, then divide by the group's
size)."""


def _launch(fn: Callable[..., Any], world_size: int, args: tuple, what: str) -> list[Any]:
    return launch_learner(
        fn,
        world_size,
        backend="gloo",
        args=args,
        timeout_s=TIMEOUT_S,
        did_not_finish=what + " on {world_size} {ranks} did not finish:",
        hang="",
        stacks=True,
        failed=what + " on {world_size} {ranks}: {cause}",
    )


def _serve(rank: int, world_size: int, fn: Callable[..., Any], problem) -> Any:
    return parameter_server(problem, UPDATES, apply_fn=fn)


def _apply_by_hand(fn: Callable[..., Any]) -> None:
    theta, grad = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.5, 1.0, -1.0])
    before = theta
    result = fn(theta, 7, grad, 4, 0.1)
    if not isinstance(result, tuple) or len(result) != 2:
        raise ExerciseFailed(f"return (new_version, staleness), a pair; got {result!r}")
    version, staleness = (int(v) for v in result)
    if version != 8:
        raise ExerciseFailed(f"after version 7 the server is at version 8, you returned {version}")
    if staleness != 3:
        raise ExerciseFailed(
            f"a gradient computed on version 4 and applied at version 7 is 3 updates stale "
            f"(measure before counting this update); you returned {staleness}"
        )
    want = torch.tensor([0.95, -2.1, 0.6])
    if not torch.allclose(before, want, rtol=0, atol=1e-6):
        raise ExerciseFailed(
            f"theta should be updated in place to θ − lr·g = {want.tolist()}, but the tensor "
            f"passed in holds {before.tolist()} (assign with theta.add_/sub_, not theta = ...)"
        )


@exercise("08_apply_gradient", reference=apply_gradient, prompt=APPLY_PROMPT)
def check_apply_gradient(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check the server's step by hand, then inside the parameter server on 2 and 3 ranks.

    Args:
        fn: the learner's ``fn(theta, version, grad, grad_version, lr) -> (version, staleness)``.

    Returns:
        ``{"updates": 8, "staleness_3_ranks": [...]}``: what the two-worker run measured.

    Raises:
        ExerciseFailed: a wrong version, staleness or update; or the run failed.
    """
    _apply_by_hand(fn)
    problem = regression_problem(n_samples=128)
    one = _launch(_serve, 2, (fn, problem), "the parameter server with one worker")[0]
    ref, _ = reference_sgd(problem, [[(1, k)] for k in range(UPDATES)])
    if one.staleness != [0] * UPDATES:
        raise ExerciseFailed(f"with one worker every staleness is 0; measured {one.staleness}")
    if not torch.equal(one.params, ref):
        gap = float((one.params - ref).abs().max())
        raise ExerciseFailed(f"one worker must be sequential SGD exactly; max difference {gap}")
    two = _launch(_serve, 3, (fn, problem), "the parameter server with two workers")[0]
    if two.update != list(range(1, UPDATES + 1)) or min(two.staleness) < 0:
        raise ExerciseFailed(
            f"versions must count 1..{UPDATES} and staleness be ≥ 0; measured versions "
            f"{two.update}, staleness {two.staleness}"
        )
    return {"updates": UPDATES, "staleness_3_ranks": two.staleness}


def _theta(rank: int) -> torch.Tensor:
    return torch.arange(4, dtype=torch.float32) * (rank + 1) + rank


def _average(rank: int, world_size: int, fn: Callable[..., Any], groups: tuple = ()) -> Any:
    theta = _theta(rank)
    made = [(ranks, dist.new_group(list(ranks))) for ranks in groups]  # collective: all ranks
    fn(theta, next((g for ranks, g in made if rank in ranks), None))
    dist.barrier()
    return theta


def _check_means(got: list[torch.Tensor], groups: tuple) -> None:
    world_mean = torch.stack([_theta(r) for r in range(len(got))]).mean(0)
    where = f"on {len(got)} ranks" + (f" in groups {[list(g) for g in groups]}" if groups else "")
    for ranks in groups or (tuple(range(len(got))),):
        want = torch.stack([_theta(r) for r in ranks]).mean(0)
        for rank in ranks:
            theta = got[rank]
            if torch.allclose(theta, want, rtol=1e-6, atol=1e-6):
                continue
            hint = "sum with all_reduce, then divide by the group's size"
            if groups and torch.allclose(theta, world_mean, rtol=1e-6, atol=1e-6):
                hint = (
                    f"that is the mean over all {len(got)} ranks, not over the group "
                    f"{list(ranks)}: pass group= to dist.all_reduce and dist.get_world_size"
                )
            raise ExerciseFailed(
                f"{where}, rank {rank} holds {theta.tolist()}; the mean of its group's inputs "
                f"is {want.tolist()} ({hint})"
            )


def _local_vs_sync(rank: int, world_size: int, fn: Callable[..., Any], problem) -> Any:
    local = local_sgd(problem, 4, 1, average_fn=fn)
    return local.params, sync_sgd(problem, 4).params


@exercise("08_average_parameters", reference=average_parameters, prompt=AVERAGE_PROMPT)
def check_average_parameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check parameter averaging on 3 ranks, then local SGD with H = 1 against sync SGD.

    Args:
        fn: the learner's ``fn(theta, group=None)``, averaging ``theta`` in place.

    Returns:
        ``{"world_size": 3, "mean": [...], "groups": [[...], ...]}``: the 3-rank mean and the
        subgroups of the 4-rank check.

    Raises:
        ExerciseFailed: a rank does not hold the mean of its group (the world, or its
            subgroup), or local SGD (H = 1) ≠ sync SGD.
    """
    _check_means(_launch(_average, 3, (fn,), "averaging"), ())
    n_ranks = 1 + max(r for g in GROUPS for r in g)
    _check_means(_launch(_average, n_ranks, (fn, GROUPS), "averaging in groups"), GROUPS)
    want = torch.stack([_theta(r) for r in range(3)]).mean(0)
    problem = regression_problem(n_samples=128)
    local, sync = _launch(_local_vs_sync, 2, (fn, problem), "local SGD with H = 1")[0]
    if not torch.allclose(local, sync, rtol=1e-5, atol=1e-6):
        raise ExerciseFailed("local SGD with H = 1 must take the same steps as sync SGD")
    return {"world_size": 3, "mean": want.tolist(), "groups": [list(g) for g in GROUPS]}
