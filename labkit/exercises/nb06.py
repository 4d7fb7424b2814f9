"""Exercises of notebooks/06_data_parallel.ipynb.

Introduced in notebooks/06_data_parallel.ipynb.

``06_average_gradients``: the heart of data parallelism — after ``loss.backward()`` on this
rank's shard, make every parameter's ``.grad`` the average over ranks (one all-reduce per
parameter, then divide by the world size; Li et al. 2020, "PyTorch Distributed", §3.1). The
checker runs the learner's function on 2 and 3 ranks through ``lk.launch``: each rank takes
its own slice of a batch, and every rank's gradients must equal those of one process that
computes the loss on the whole batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import first_cause
from labkit.launcher import LaunchTimeout, RankError, launch

WORLD_SIZES = (2, 3)  # ranks the checker launches
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

    Introduced in notebooks/06_data_parallel.ipynb.

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


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> dict[str, Any]:
    x, y = _batch(world_size)
    shard = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    model = _model()
    nn.functional.cross_entropy(model(x[shard]), y[shard]).backward()
    local = {n: p.grad.clone() for n, p in model.named_parameters()}
    fn(model)
    got = {n: None if p.grad is None else p.grad.clone() for n, p in model.named_parameters()}
    return {"local": local, "got": got}


def _reference(world_size: int) -> dict[str, torch.Tensor]:
    """One process, the loss on the whole batch."""
    x, y = _batch(world_size)
    model = _model()
    nn.functional.cross_entropy(model(x), y).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def _hint(got: torch.Tensor, want: torch.Tensor, local: torch.Tensor, world_size: int) -> str:
    if torch.allclose(got, local, rtol=RTOL, atol=ATOL):
        return "It still holds this rank's own gradient: all-reduce it across the ranks."
    if torch.allclose(got, want * world_size, rtol=RTOL, atol=ATOL):
        return f"It is {world_size}× the average: the all-reduce sums; divide by the world size."
    return "Compare it with the average of all ranks' gradients."


def _compare(world_size: int, results: list[dict[str, Any]]) -> None:
    want = _reference(world_size)
    for rank, res in enumerate(results):
        for name, ref in want.items():
            got = res["got"][name]
            if got is None:
                raise ExerciseFailed(
                    f"on {world_size} ranks, rank {rank}: {name}.grad is None afterwards; "
                    "average the gradients in place (keep .grad)"
                )
            if not torch.allclose(got, ref, rtol=RTOL, atol=ATOL):
                hint = _hint(got, ref, res["local"][name], world_size)
                err = (got - ref).abs().max().item()
                raise ExerciseFailed(
                    f"on {world_size} ranks, rank {rank}: {name}.grad differs from the gradient "
                    f"of one process on the whole batch (max |Δ| = {err:.3g}). {hint}"
                )


@exercise("06_average_gradients", reference=average_gradients, prompt=PROMPT)
def check_average_gradients(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a gradient-averaging function against one process on the whole batch.

    Introduced in notebooks/06_data_parallel.ipynb.

    Args:
        fn: the learner's ``fn(model, group=None)``, averaging gradients in place.

    Returns:
        ``{"world_sizes": [...], "parameters": n}``: the worlds and parameters checked.

    Raises:
        ExerciseFailed: a rank's gradient differs from the whole-batch gradient, the function
            raised, or it hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for world_size in WORLD_SIZES:
        try:
            results = launch(
                _run,
                world_size=world_size,
                backend="gloo",
                device="cpu",
                args=(fn,),
                timeout=TIMEOUT_S,
            )
        except LaunchTimeout as exc:
            raise ExerciseFailed(
                f"on {world_size} ranks the function did not finish within {TIMEOUT_S:g} s. "
                "Every rank must all-reduce the same parameters in the same order.\n" + exc.headline
            ) from exc
        except RankError as exc:
            if all(f.exc_type == "NotImplementedError" for f in exc.failures.values()):
                raise  # not attempted: check() runs the reference instead
            raise ExerciseFailed(f"on {world_size} ranks, {first_cause(exc)}") from exc
        _compare(world_size, results)
    return {"world_sizes": list(WORLD_SIZES), "parameters": len(list(_model().parameters()))}
