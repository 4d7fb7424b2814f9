"""Exercises of notebooks/13_zero_and_fsdp.ipynb.

Introduced in notebooks/13_zero_and_fsdp.ipynb.

``13_zero1_update``: the update of ZeRO stage 1 (Rajbhandari et al. 2020, §5.1) on one flat
parameter buffer, with the paper's communication (§7.2.1): pad the buffer with zeros to a
multiple of N_d, reduce-scatter the gradients so each rank receives the average over ranks
of its own 1/N_d shard only, let each rank update that shard (the only part whose optimizer
state it keeps), then all-gather the updated shards so every rank holds all the new
parameters — a reduce-scatter and an all-gather of Ψ, the 2Ψ of data parallelism's
all-reduce. The checker runs the learner's function on 2 and 3 ranks through ``lk.launch``
over the recording backend, on a buffer whose length every world size divides and on one
that none does (so the padding is exercised), and compares every rank's parameters with one
process applying the update to the whole buffer with the averaged gradient; it also checks
which shard each rank stepped and that the gradients were reduce-scattered, not all-reduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner

WORLD_SIZES = (2, 3)  # ranks the checker launches
SIZES = (12, 13)  # buffer lengths: 12 is a multiple of every world size, 13 of none
LR = 0.5  # the update step_shard applies: p -= LR * g
TIMEOUT_S = 60.0
RTOL, ATOL = 1e-6, 1e-6
ALL_REDUCE = ("all_reduce", "all_reduce_coalesced")
REDUCE_SCATTER = ("reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_tensor_coalesced")
ALL_GATHER = ("all_gather", "all_gather_into_tensor", "all_gather_into_tensor_coalesced")

PROMPT = """Write `zero1_update(flat_params, flat_grads, step_shard, group=None)`: both tensors are
1-D of the same length N (any N), and `flat_grads` holds this rank's gradient. With
s = ceil(N / world size), pad both with zeros at the end to s · world size elements;
reduce-scatter the padded gradients so this rank receives the sum over ranks of its shard,
elements [rank·s, (rank+1)·s), and divide it by the world size; call
`step_shard(param_shard, grad_shard)` once, on this rank's s-element shard of the padded
parameters (it updates the shard in place); all-gather the shards and copy the first N
elements back into `flat_params`. (An all-reduce gives the same numbers but moves twice the
gradient bytes: the checker asks for the reduce-scatter.)"""


def zero1_update(
    flat_params: torch.Tensor,
    flat_grads: torch.Tensor,
    step_shard: Callable[[torch.Tensor, torch.Tensor], None],
    group: dist.ProcessGroup | None = None,
) -> None:
    """ZeRO-1's update: reduce-scatter the gradients, step this rank's shard, all-gather.

    Reference solution of exercise ``13_zero1_update``; ``lk.parallel.zero.ZeroStage1`` does
    the same per layer (ZeRO, Rajbhandari et al. 2020, §5.1; communication §7.2.1).

    Args:
        flat_params: the full parameters, 1-D of N elements (updated in place).
        flat_grads: this rank's full gradient, 1-D, same length (left as it was).
        step_shard: the optimizer's update of one shard, in place.
        group: the data-parallel group (None: the default group).

    Returns:
        None.

    Raises:
        RuntimeError: from ``torch.distributed`` when the group is not initialised.
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    n = flat_params.numel()
    s = -(-n // world_size)  # ceil: the padded buffer splits into equal shards
    grads = flat_grads.new_zeros(s * world_size)
    grads[:n] = flat_grads
    grad_shard = grads.new_empty(s)
    dist.reduce_scatter_tensor(grad_shard, grads, group=group)  # sum of my shard
    grad_shard /= world_size
    params = flat_params.new_zeros(s * world_size)
    params[:n] = flat_params
    shard = params[rank * s : (rank + 1) * s].clone()
    step_shard(shard, grad_shard)
    dist.all_gather_into_tensor(params, shard, group=group)
    flat_params.copy_(params[:n])


def _data(rank: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    params = torch.arange(1, n + 1, dtype=torch.float32) / n  # the same on every rank, no 0
    grads = torch.randn(n, generator=torch.Generator().manual_seed(13 + rank))
    return params, grads


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> dict[int, dict[str, Any]]:
    from labkit.backends import recording

    out = {}
    for n in SIZES:
        params, grads = _data(rank, n)
        calls: list[torch.Tensor] = []

        def step_shard(p: torch.Tensor, g: torch.Tensor, calls: list = calls) -> None:
            calls.append(p.detach().clone())
            p.sub_(LR * g)

        recording.clear()
        fn(params, grads, step_shard)
        ops = [(r.op, r.n_bytes) for r in recording.records()]
        out[n] = {"params": params, "calls": calls, "ops": ops}
    return out


def _want(world_size: int, n: int) -> torch.Tensor:
    grads = torch.stack([_data(r, n)[1] for r in range(world_size)])
    return _data(0, n)[0] - LR * grads.mean(0)


def _hint(got: torch.Tensor, world_size: int, rank: int, n: int) -> str:
    start, grads = _data(0, n)[0], [_data(r, n)[1] for r in range(world_size)]
    want, mean = _want(world_size, n), torch.stack(grads).mean(0)
    s = -(-n // world_size)
    mine = slice(rank * s, min((rank + 1) * s, n))
    pad = s * world_size - n

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.allclose(a, b, rtol=RTOL, atol=ATOL)

    if close(got, start - LR * mean * world_size):
        return "The update is N_d× too large: the reduction sums; divide by the world size."
    if pad and close(got, torch.cat([want, want.new_zeros(pad)])[pad:]):
        return (
            "The parameters are shifted by the padding: the zeros go at the end, so copy the "
            f"first N = {n} elements of the gathered buffer back."
        )
    if close(got[mine], want[mine]):
        return "This rank's own shard is right, the others are not: all-gather the shards."
    if close(got[mine], (start - LR * grads[rank])[mine]):
        return "This rank stepped with its own gradient: reduce-scatter the gradients first."
    return "Compare with one process stepping the whole buffer with the averaged gradient."


def _check_calls(world_size: int, rank: int, n: int, calls: list[torch.Tensor]) -> None:
    """Raise unless ``step_shard`` got this rank's s-element shard, padded at the end, once."""
    s = -(-n // world_size)
    sizes = [c.numel() for c in calls]
    if sizes != [s]:
        why = (
            f"; {n} is not a multiple of {world_size}: pad to {s * world_size} elements"
            if n % world_size and sizes == [n // world_size]
            else ""
        )
        raise ExerciseFailed(
            f"on {world_size} ranks with N = {n}, rank {rank} called step_shard with "
            f"{sizes} elements; call it once, on this rank's shard of ⌈{n} / {world_size}⌉ = "
            f"{s} elements (its optimizer state is all that rank keeps){why}"
        )
    start = _data(0, n)[0]
    padded = torch.cat([start, start.new_zeros(s * world_size - n)])
    if not torch.equal(calls[0], padded[rank * s : (rank + 1) * s]):
        raise ExerciseFailed(
            f"on {world_size} ranks with N = {n}, rank {rank} stepped the wrong elements: its "
            f"shard is elements [{rank * s}, {(rank + 1) * s}) of the buffer padded with zeros "
            "at the end (the padding belongs to the last rank's shard)"
        )


def _check_ops(world_size: int, rank: int, n: int, ops: list[tuple[str, int]]) -> None:
    """Raise unless the gradients were reduce-scattered and the shards all-gathered."""
    names = [op for op, _ in ops]
    if any(op in ALL_REDUCE for op in names):
        raise ExerciseFailed(
            f"on {world_size} ranks with N = {n}, rank {rank} issued {names}: an all-reduce "
            "sends every rank the whole averaged gradient, though it steps only its shard "
            "(2Ψ for the gradients + Ψ for the all-gather = 3Ψ). Reduce-scatter instead: each "
            "rank receives only its shard's average, and the step moves 2Ψ, as data "
            "parallelism does (ZeRO §7.2.1)."
        )
    if not any(op in REDUCE_SCATTER for op in names) or not any(op in ALL_GATHER for op in names):
        raise ExerciseFailed(
            f"on {world_size} ranks with N = {n}, rank {rank} issued {names}: reduce-scatter "
            "the gradients, then all-gather the updated shards"
        )


def _compare(world_size: int, results: list[dict[int, dict[str, Any]]]) -> None:
    for n in SIZES:
        want = _want(world_size, n)
        for rank, res in enumerate(results):
            _check_calls(world_size, rank, n, res[n]["calls"])
            got = res[n]["params"]
            if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
                err = (got - want).abs().max().item()
                raise ExerciseFailed(
                    f"on {world_size} ranks with N = {n}, rank {rank}: the parameters differ "
                    f"from one process's update with the averaged gradient (max |Δ| = "
                    f"{err:.3g}). " + _hint(got, world_size, rank, n)
                )
            _check_ops(world_size, rank, n, res[n]["ops"])


@exercise("13_zero1_update", reference=zero1_update, prompt=PROMPT)
def check_zero1_update(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a ZeRO-1 update against one process stepping the whole buffer.

    Args:
        fn: the learner's ``fn(flat_params, flat_grads, step_shard, group=None)``.

    Returns:
        ``{"world_sizes": [...], "numels": [...]}``: what was checked.

    Raises:
        ExerciseFailed: a rank's parameters differ, ``step_shard`` was not called once on
            the rank's shard (padded at the end), the gradients were all-reduced instead of
            reduce-scattered, the function raised, or it hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for world_size in WORLD_SIZES:
        results = launch_learner(
            _run,
            world_size,
            backend="labkit_record",
            args=(fn,),
            timeout_s=TIMEOUT_S,
            hang="Every rank must issue the same collectives in the same order.",
        )
        _compare(world_size, results)
    return {"world_sizes": list(WORLD_SIZES), "numels": list(SIZES)}
