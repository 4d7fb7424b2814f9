"""Exercises of notebooks/01_point_to_point.ipynb.

Introduced in notebooks/01_point_to_point.ipynb.

``01_ring_exchange``: on a ring of p ranks, every rank sends its tensor to both neighbours and
receives both of theirs — the halo exchange of stencil codes, and the step every ring
algorithm of notebook 03 repeats. With blocking ``send``/``recv`` the obvious order (everyone
sends first) deadlocks: gloo's ``send`` waits for the matching ``recv``. The pair fix "even
ranks send first" still deadlocks on an odd ring, where two even ranks are neighbours. The
checker runs the learner's function on 2, 3 and 4 ranks through ``lk.launch`` with a short
timeout and compares what each rank received with its neighbours' tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import DEADLOCK, launch_learner

WORLD_SIZES = (2, 3, 4)  # 3: an odd ring, where even-ranks-send-first deadlocks
TIMEOUT_S = 15.0  # per launch; a correct answer takes milliseconds, a deadlock forever
_SHAPE = (2, 3)  # a 2-D tensor: the answer must keep the shape

PROMPT = """Write `ring_exchange(rank, world_size, x)`: send `x` to both ring neighbours,
(rank - 1) % world_size and (rank + 1) % world_size, receive both of theirs, and return
`(from_left, from_right)`. It must not deadlock for any world size, odd ones included."""


def ring_exchange(
    rank: int, world_size: int, x: torch.Tensor, group: dist.ProcessGroup | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Swap ``x`` with both ring neighbours without deadlock: post every send and recv, then wait.

    Reference solution of exercise ``01_ring_exchange``. All four transfers are posted before
    any is waited on, so no rank blocks while its neighbour blocks on it (MPI-3.1 standard
    §3.5 on "unsafe" exchanges that deadlock, §3.7 on nonblocking communication). They are
    posted as one ``dist.batch_isend_irecv``: on gloo four separate ``isend``/``irecv`` would
    do too, but on NCCL each pair of ranks gets its communicator on first use, and creating
    it blocks until the peer joins, so separate calls on a ring of 3 or more ranks can wait in
    a cycle; a batch is one NCCL group (its docstring: "the relative ordering of sends vs.
    receives in the list does not matter and will not cause deadlocks"). Messages between one
    pair of ranks are matched in the order they were sent (§3.5, "Order"), so even on 2 ranks
    (left = right) the two receives match the two sends.

    Args:
        rank: this rank (global).
        world_size: ranks on the ring.
        x: this rank's tensor.
        group: the process group (default: the default group).

    Returns:
        ``(from_left, from_right)``: the tensors of ranks ``rank - 1`` and ``rank + 1``
        (mod ``world_size``).

    Raises:
        RuntimeError: from ``torch.distributed`` when no process group is initialised.
    """
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    from_left, from_right = torch.empty_like(x), torch.empty_like(x)
    ops = [
        dist.P2POp(dist.isend, x, right, group=group),  # my right neighbour's from_left
        dist.P2POp(dist.isend, x, left, group=group),  # my left neighbour's from_right
        dist.P2POp(dist.irecv, from_left, left, group=group),
        dist.P2POp(dist.irecv, from_right, right, group=group),
    ]
    for work in dist.batch_isend_irecv(ops):  # one batch: what NCCL needs, and gloo accepts
        work.wait()
    return from_left, from_right


def _input(rank: int) -> torch.Tensor:
    return torch.arange(6, dtype=torch.float32).reshape(_SHAPE) + 100.0 * rank


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> Any:
    out = fn(rank, world_size, _input(rank))
    if isinstance(out, (tuple, list)):
        return [t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in out]
    return out


def _who(t: Any, world_size: int) -> str:
    """Whose tensor ``t`` is, for the message ("rank 2's x", or its value)."""
    for r in range(world_size):
        if isinstance(t, torch.Tensor) and t.shape == _SHAPE and torch.equal(t, _input(r)):
            return f"rank {r}'s x"
    return repr(t)


def _compare(world_size: int, results: list[Any]) -> None:
    for rank, out in enumerate(results):
        if not isinstance(out, list) or len(out) != 2:
            raise ExerciseFailed(
                f"on {world_size} ranks, rank {rank} returned {out!r}; "
                "return the pair (from_left, from_right)"
            )
        left, right = (rank - 1) % world_size, (rank + 1) % world_size
        for side, got, peer in (("from_left", out[0], left), ("from_right", out[1], right)):
            if not (isinstance(got, torch.Tensor) and got.shape == _SHAPE):
                raise ExerciseFailed(
                    f"on {world_size} ranks, rank {rank}'s {side} is {got!r}; expected a "
                    f"tensor of shape {_SHAPE} (receive into torch.empty_like(x))"
                )
            if not torch.equal(got, _input(peer)):
                raise ExerciseFailed(
                    f"on {world_size} ranks, rank {rank}'s {side} should be rank {peer}'s x "
                    f"but is {_who(got, world_size)}. Left is (rank - 1) % world_size, right "
                    "is (rank + 1) % world_size."
                )


@exercise("01_ring_exchange", reference=ring_exchange, prompt=PROMPT)
def check_ring_exchange(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a neighbour exchange on rings of 2, 3 and 4 ranks: right values, no deadlock.

    Args:
        fn: the learner's ``fn(rank, world_size, x) -> (from_left, from_right)``.

    Returns:
        ``{"world_sizes": [...]}``: the rings checked.

    Raises:
        ExerciseFailed: a rank received the wrong tensor, returned something else, raised,
            or the ranks deadlocked (no result within ``TIMEOUT_S``).
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for world_size in WORLD_SIZES:
        results = launch_learner(
            _run,
            world_size,
            backend="gloo",  # the ordering is the point; gloo runs everywhere
            args=(fn,),
            timeout_s=TIMEOUT_S,
            did_not_finish=DEADLOCK,
            hang="A blocking send waits for its matching recv; if every rank first sends (or "
            "first receives), each waits for a neighbour that waits too. Post every transfer "
            "first and wait on them afterwards: dist.isend/dist.irecv (gloo), or one "
            "dist.batch_isend_irecv (also on NCCL). Where each rank was:",
            stacks=True,
        )
        _compare(world_size, results)
    return {"world_sizes": list(WORLD_SIZES)}
