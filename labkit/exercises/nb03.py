"""Exercises of notebooks/03_allreduce_algorithms.ipynb.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

``03_ring_all_gather``: write the all-gather phase of the ring all-reduce (Thakur,
Rabenseifner and Gropp 2005, §3–4; Patarasuk and Yuan 2009). On entry rank r holds a valid
chunk r of the tensor (chunks as ``lk.collectives.chunk_bounds`` cuts them); in each of p−1
steps every rank sends one chunk to its right neighbour and receives one from its left, so
on exit every rank holds every chunk. The checker runs the learner's function on 2, 3 and 4
ranks through ``lk.launch``, on sizes smaller than p and not divisible by p, compares every
rank's tensor with the concatenation of the owners' chunks, and records the sends: exactly
p−1 per rank, all to rank (r+1) mod p, the one in step s carrying chunk (r−s) mod p's
elements and no more (forwarding the whole buffer gives the right result but sends p times
the ring's bytes).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from labkit.collectives import P2P, chunk_bounds, chunk_sizes
from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import DEADLOCK, launch_learner

WORLD_SIZES = (2, 3, 4)
SIZES = (2, 10)  # 2 < p for p = 3, 4 (empty chunks); 10 is not divisible by 3 or 4
TIMEOUT_S = 30.0  # per launch; a correct answer takes milliseconds, a deadlock forever
PLACEHOLDER = -1.0  # what a chunk holds before it arrives
_FORBIDDEN = ("all_gather", "all_gather_into_tensor", "all_reduce", "broadcast", "all_to_all")

PROMPT = """Write `my_all_gather(tensor, group=None)`: the all-gather phase of the ring.
`tensor` is 1-D, cut into p chunks by `lk.collectives.chunk_bounds(tensor.numel(), p)`; on entry
rank r's chunk r is valid. In step s (s = 0 … p−2) rank r sends chunk (r − s) mod p to rank
(r + 1) mod p and receives chunk (r − s − 1) mod p from rank (r − 1) mod p, straight into place
(use `lk.collectives.P2P(group).exchange(...)`, or one `dist.batch_isend_irecv` of a
`dist.P2POp` send and receive, and wait on both). Two separate `dist.isend` / `dist.irecv`
work on gloo but can deadlock on NCCL: there each pair of ranks gets its communicator on first
use, created blocking until the peer joins, so separate calls around a ring of 3 or more can
wait in a cycle; one batch is one NCCL group."""


def ring_all_gather(tensor: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """Ring all-gather in place: forward, p−1 times, the chunk that arrived in the last step.

    Reference solution of exercise ``03_ring_all_gather``; ``lk.collectives.all_gather_ring``
    is the same algorithm. Thakur, Rabenseifner and Gropp 2005, §3 (ring all-gather).

    Args:
        tensor: 1-D; chunk r (``chunk_bounds``) valid on rank r; every chunk valid afterwards.
        group: the process group (default: the default group).

    Returns:
        None; ``tensor`` is filled in place.

    Raises:
        RuntimeError: from ``torch.distributed`` when no process group is initialised.
    """
    p2p = P2P(group)
    p, r = p2p.world_size, p2p.rank
    chunks = [tensor[a:b] for a, b in chunk_bounds(tensor.numel(), p)]
    for step in range(p - 1):
        send, recv = chunks[(r - step) % p], chunks[(r - step - 1) % p]
        p2p.at("all-gather", step).exchange(send, (r + 1) % p, recv, (r - 1) % p)


def _owned(rank: int, numel: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s input: its own chunk holds 100·(rank+1) + i, the rest placeholders."""
    t = torch.full((numel,), PLACEHOLDER)
    a, b = chunk_bounds(numel, world_size)[rank]
    t[a:b] = 100.0 * (rank + 1) + torch.arange(b - a, dtype=torch.float32)
    return t


@contextmanager
def _watch_sends(log: list[tuple[int, int]]) -> Iterator[None]:
    """Record ``(destination, elements)`` of every send; refuse the collectives built here."""
    saved: list[tuple[Any, str, Any]] = []

    def counted(original: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(original)

        def call(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs).arguments
            dst = bound.get("group_dst")
            dst = bound.get("dst") if dst is None else dst  # default group: the same
            log.append((dst, bound["tensor"].numel()))
            return original(*args, **kwargs)

        return call

    def refuse(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise ExerciseFailed(
                f"dist.{name} does the work this exercise builds, so it is switched off here: "
                "use send/recv (isend/irecv) only"
            )

        return call

    # c10d's send calls c10d's isend, and dist.P2POp / batch_isend_irecv compare ops with
    # c10d's isend: wrapping isend in both namespaces counts every kind of send exactly once.
    wrapped = counted(c10d.isend)
    for module in (dist, c10d):
        saved.append((module, "isend", module.isend))
        module.isend = wrapped
    for name in _FORBIDDEN:
        saved.append((dist, name, getattr(dist, name)))
        setattr(dist, name, refuse(name))
    try:
        yield
    finally:
        for module, name, fn in reversed(saved):
            setattr(module, name, fn)


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> list[dict[str, Any]]:
    out = []
    for numel in SIZES:
        t = _owned(rank, numel, world_size)
        sends: list[tuple[int, int]] = []
        with _watch_sends(sends):
            fn(t)
        out.append({"numel": numel, "got": t, "sends": sends})
        dist.barrier()  # keep the sizes apart even if an answer sends too much
    return out


def _whose(values: torch.Tensor, numel: int, world_size: int) -> str:
    if bool((values == PLACEHOLDER).all()):
        return "still the placeholder (never received)"
    for r in range(world_size):
        a, b = chunk_bounds(numel, world_size)[r]
        if torch.equal(values, _owned(r, numel, world_size)[a:b]):
            return f"rank {r}'s chunk"
    return f"{values.tolist()}"


def _gathered(numel: int, world_size: int) -> torch.Tensor:
    """What every rank must hold afterwards: chunk c from rank c."""
    t = torch.empty(numel)
    for c, (a, b) in enumerate(chunk_bounds(numel, world_size)):
        t[a:b] = _owned(c, numel, world_size)[a:b]
    return t


def _compare(world_size: int, results: list[list[dict[str, Any]]]) -> None:
    for rank, rows in enumerate(results):
        for row in rows:
            numel, got = row["numel"], row["got"]
            want = _gathered(numel, world_size)
            if not isinstance(got, torch.Tensor) or got.shape != want.shape:
                raise ExerciseFailed(f"rank {rank}'s tensor changed shape; fill it in place")
            for c, (a, b) in enumerate(chunk_bounds(numel, world_size)):
                if not torch.equal(got[a:b], want[a:b]):
                    raise ExerciseFailed(
                        f"on {world_size} ranks with {numel} elements, rank {rank}'s chunk {c} "
                        f"(elements {a}:{b}) should be rank {c}'s chunk but is "
                        f"{_whose(got[a:b], numel, world_size)}. In step s rank r receives "
                        "chunk (r − s − 1) mod p from its left neighbour."
                    )
            _check_sends(world_size, rank, numel, row["sends"])


def _check_sends(world_size: int, rank: int, numel: int, sends: list[tuple[int, int]]) -> None:
    """p − 1 sends to the right neighbour, step s carrying exactly chunk (r − s) mod p."""
    p, right = world_size, (rank + 1) % world_size
    peers = [d for d, _ in sends]
    if len(sends) != p - 1 or any(d != right for d in peers):
        raise ExerciseFailed(
            f"on {p} ranks, rank {rank} sent {len(sends)} message(s) to rank(s) {peers}; a "
            f"ring all-gather sends p − 1 = {p - 1}, each to its right neighbour (rank {right})"
        )
    sizes = chunk_sizes(numel, p)
    for step, (_, got) in enumerate(sends):
        want = sizes[(rank - step) % p]
        if got != want:
            raise ExerciseFailed(
                f"on {p} ranks with {numel} elements, rank {rank}'s send in step {step} carried "
                f"{got} element(s); a ring step sends one chunk, chunk (r − s) mod p = "
                f"{(rank - step) % p} of {want} element(s). The result may be right, but "
                f"sending {'the whole buffer' if got == numel else 'more than that chunk'} "
                "multiplies the traffic the ring exists to save: send the chunk's view, "
                "e.g. tensor[a:b] with (a, b) from chunk_bounds."
            )


@exercise("03_ring_all_gather", reference=ring_all_gather, prompt=PROMPT)
def check_ring_all_gather(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a ring all-gather on 2, 3 and 4 ranks: every chunk in place, p−1 sends to the right.

    Args:
        fn: the learner's ``fn(tensor, group=None)``, filling ``tensor`` in place.

    Returns:
        ``{"world_sizes": [...], "sizes": [...]}``: what was checked.

    Raises:
        ExerciseFailed: a rank holds a wrong chunk, sent other than p−1 messages to its right
            neighbour, called a collective, raised, or the ranks deadlocked.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for world_size in WORLD_SIZES:
        results = launch_learner(
            _run,
            world_size,
            backend="gloo",  # the algorithm is the point; gloo runs everywhere
            args=(fn,),
            timeout_s=TIMEOUT_S,
            did_not_finish=DEADLOCK,
            hang="Every rank must send and receive in every step, with the send and the receive "
            "both in flight (P2P.exchange or dist.batch_isend_irecv; separate isend + irecv "
            "on gloo only). Where each rank was:",
            stacks=True,
        )
        _compare(world_size, results)
    return {"world_sizes": list(WORLD_SIZES), "sizes": list(SIZES)}
