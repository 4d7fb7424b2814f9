"""Exercises of notebooks/13_zero_and_fsdp.ipynb.

Introduced in notebooks/13_zero_and_fsdp.ipynb.

``13_zero1_update``: the update of ZeRO stage 1 (Rajbhandari et al. 2020, §5.1) on one flat
parameter buffer — average the gradients over the ranks, let each rank update only its
1/N_d shard (the only part whose optimizer state it keeps), then all-gather the updated
shards so every rank holds all the new parameters. The checker runs the learner's function
on 2 and 3 ranks through ``lk.launch`` and compares every rank's parameters with one process
applying the update to the whole buffer with the averaged gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import first_cause
from labkit.launcher import LaunchTimeout, RankError, launch

WORLD_SIZES = (2, 3)  # ranks the checker launches
N = 12  # elements of the flat buffer: a multiple of every world size checked
LR = 0.5  # the update step_shard applies: p -= LR * g
TIMEOUT_S = 60.0
RTOL, ATOL = 1e-6, 1e-6

PROMPT = """Write `zero1_update(flat_params, flat_grads, step_shard, group=None)`: both tensors are
1-D, of a length that the world size divides, and `flat_grads` holds this rank's gradient.
Average the gradients over the ranks, call `step_shard(param_shard, grad_shard)` once, on this
rank's shard only (elements [rank·s, (rank+1)·s) with s = length / world size; it updates the
shard in place), then all-gather so that `flat_params` holds every rank's updated shard."""


def zero1_update(
    flat_params: torch.Tensor,
    flat_grads: torch.Tensor,
    step_shard: Callable[[torch.Tensor, torch.Tensor], None],
    group: dist.ProcessGroup | None = None,
) -> None:
    """ZeRO-1's update: average gradients, step this rank's shard, all-gather the shards.

    Reference solution of exercise ``13_zero1_update``; ``lk.parallel.zero.ZeroStage1`` does
    the same per layer (ZeRO, Rajbhandari et al. 2020, §5.1).

    Introduced in notebooks/13_zero_and_fsdp.ipynb.

    Args:
        flat_params: the full parameters, 1-D (updated in place).
        flat_grads: this rank's full gradient, 1-D, same length (averaged in place).
        step_shard: the optimizer's update of one shard, in place.
        group: the data-parallel group (None: the default group).

    Returns:
        None.

    Raises:
        RuntimeError: from ``torch.distributed`` when the group is not initialised.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    dist.all_reduce(flat_grads, group=group)
    flat_grads /= world_size
    s = flat_params.numel() // world_size
    shard = flat_params[rank * s : (rank + 1) * s]
    step_shard(shard, flat_grads[rank * s : (rank + 1) * s])
    dist.all_gather_into_tensor(flat_params, shard.clone(), group=group)


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    params = torch.arange(N, dtype=torch.float32) / N  # the same on every rank
    grads = torch.randn(N, generator=torch.Generator().manual_seed(13 + rank))
    return params, grads


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> dict[str, Any]:
    params, grads = _data(rank)
    calls: list[int] = []

    def step_shard(p: torch.Tensor, g: torch.Tensor) -> None:
        calls.append(p.numel())
        p.sub_(LR * g)

    fn(params, grads, step_shard)
    return {"params": params, "calls": calls}


def _hint(got: torch.Tensor, world_size: int, rank: int) -> str:
    start, grads = _data(0)[0], [_data(r)[1] for r in range(world_size)]
    mean = torch.stack(grads).mean(0)
    s = N // world_size
    mine = slice(rank * s, (rank + 1) * s)
    if torch.allclose(got, start - LR * mean * world_size, rtol=RTOL, atol=ATOL):
        return "The update is N_d× too large: all_reduce sums; divide by the world size."
    if torch.allclose(got[mine], (start - LR * mean)[mine], rtol=RTOL, atol=ATOL):
        return "This rank's own shard is right, the others are not: all-gather the shards."
    if torch.allclose(got[mine], (start - LR * grads[rank])[mine], rtol=RTOL, atol=ATOL):
        return "This rank stepped with its own gradient: average the gradients first."
    return "Compare with one process stepping the whole buffer with the averaged gradient."


def _compare(world_size: int, results: list[dict[str, Any]]) -> None:
    grads = torch.stack([_data(r)[1] for r in range(world_size)])
    want = _data(0)[0] - LR * grads.mean(0)
    for rank, res in enumerate(results):
        if res["calls"] != [N // world_size]:
            raise ExerciseFailed(
                f"on {world_size} ranks, rank {rank} called step_shard with "
                f"{res['calls']} elements; call it once, on this rank's shard of "
                f"{N} / {world_size} = {N // world_size} elements (its optimizer state is "
                "all that rank keeps)"
            )
        got = res["params"]
        if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            err = (got - want).abs().max().item()
            raise ExerciseFailed(
                f"on {world_size} ranks, rank {rank}: the parameters differ from one process's "
                f"update with the averaged gradient (max |Δ| = {err:.3g}). "
                + _hint(got, world_size, rank)
            )


@exercise("13_zero1_update", reference=zero1_update, prompt=PROMPT)
def check_zero1_update(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a ZeRO-1 update against one process stepping the whole buffer.

    Introduced in notebooks/13_zero_and_fsdp.ipynb.

    Args:
        fn: the learner's ``fn(flat_params, flat_grads, step_shard, group=None)``.

    Returns:
        ``{"world_sizes": [...], "numel": N}``: what was checked.

    Raises:
        ExerciseFailed: a rank's parameters differ, ``step_shard`` was not called once on
            the rank's shard, the function raised, or it hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for world_size in WORLD_SIZES:
        try:
            results = launch(
                _run, world_size=world_size, backend="gloo", device="cpu", args=(fn,),
                timeout=TIMEOUT_S,
            )  # fmt: skip
        except LaunchTimeout as exc:
            raise ExerciseFailed(
                f"on {world_size} ranks the function did not finish within {TIMEOUT_S:g} s. "
                "Every rank must issue the same collectives in the same order.\n" + exc.headline
            ) from exc
        except RankError as exc:
            if all(f.exc_type == "NotImplementedError" for f in exc.failures.values()):
                raise  # not attempted: check() runs the reference instead
            raise ExerciseFailed(f"on {world_size} ranks, {first_cause(exc)}") from exc
        _compare(world_size, results)
    return {"world_sizes": list(WORLD_SIZES), "numel": N}
