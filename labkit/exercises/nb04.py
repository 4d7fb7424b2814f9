"""Exercises of notebooks/04_custom_backend.ipynb.

Introduced in notebooks/04_custom_backend.ipynb.

``04_minimal_allreduce``: write the all-reduce of a minimal backend whose only transport is
the c10d store that ``init_process_group`` hands every backend (``store.set(key, bytes)``;
``store.get(key)`` waits until some rank has set ``key``). The checker plugs the learner's
function into ``StoreProcessGroup`` — a ``dist.ProcessGroup`` subclass with exactly what DDP
needs (``allreduce``, ``broadcast``, ``allgather``) — registers it with ``lk.BackendSpec``,
and runs ``dist.all_reduce`` through it on 2 and 3 ranks: several dtypes and shapes, the same
shape twice in a row (a reused store key hands back the previous call's values), and checks
that every rank holds the exact sum and the *same bits* (DDP replicas drift apart when ranks
add in different orders).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner
from labkit.launcher import BackendSpec

WORLD_SIZES = (2, 3)
TIMEOUT_S = 30.0  # per launch; a store.get on a key nobody sets waits this long
CASES = (  # (dtype, shape); each case runs twice with different values
    (torch.float32, (5,)),
    (torch.float32, (3, 4)),
    (torch.float64, (7,)),
    (torch.int64, (6,)),
    (torch.float32, (1,)),
)

PROMPT = """Write `my_store_allreduce(store, rank, world_size, key, tensor)`: sum `tensor` over all
ranks, in place, using only the store. Publish this rank's bytes under a key made from `key`
and `rank` (`to_bytes(tensor)`), read every rank's bytes back (`store.get` waits until they
are there; `from_bytes(data, tensor)` turns them into a tensor), and add them up in rank
order 0, 1, …, p−1 on every rank, so that every rank gets exactly the same bits."""


def to_bytes(tensor: torch.Tensor) -> bytes:
    """The raw bytes of a tensor (any dtype): what a store value can hold."""
    return tensor.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def from_bytes(data: bytes, like: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``like``'s dtype and shape, read from ``to_bytes`` output."""
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return flat.view(like.dtype).view(like.shape)


def store_allreduce(store: Any, rank: int, world_size: int, key: str, tensor: torch.Tensor):
    """Sum ``tensor`` over all ranks in place through the c10d store, in rank order.

    Reference solution of exercise ``04_minimal_allreduce``: every rank writes its bytes
    under ``{key}/{rank}``, then reads all p values and adds them 0, 1, …, p−1 — one order
    on every rank, so the bits agree everywhere (floating-point addition is not associative).
    Each call needs a fresh ``key``: a store keeps old values, and ``get`` would return them.

    Args:
        store: the group's c10d store (``set(key, bytes)``; ``get(key)`` waits for the key).
        rank: this rank in the group.
        world_size: ranks in the group.
        key: a key prefix unique to this call and the same on every rank.
        tensor: the tensor to sum; overwritten with the sum.

    Returns:
        None.

    Raises:
        RuntimeError: from the store, when a rank's value never arrives (timeout).
    """
    store.set(f"{key}/{rank}", to_bytes(tensor))
    total = from_bytes(store.get(f"{key}/0"), tensor).clone()
    for r in range(1, world_size):
        total += from_bytes(store.get(f"{key}/{r}"), tensor)
    tensor.copy_(total)


def completed(result: Any) -> dist.Work:
    """A finished Work whose future holds ``result`` (DDP reads ``get_future().value()``)."""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


class StoreProcessGroup(dist.ProcessGroup):
    """The smallest backend DDP runs on: all_reduce (SUM), broadcast and all_gather via the store.

    Args:
        store: the group's store (from the creator ``register_backend`` calls).
        rank: this rank in the group.
        world_size: ranks in the group.
        allreduce_fn: ``fn(store, rank, world_size, key, tensor)`` summing in place.
    """

    def __init__(self, store, rank: int, world_size: int, allreduce_fn: Callable = store_allreduce):
        super().__init__(rank, world_size)
        self.store, self.allreduce_fn, self.calls = store, allreduce_fn, 0

    def getBackendName(self) -> str:  # noqa: N802 - the C++ virtual's name
        return "store"

    def _key(self, op: str) -> str:
        self.calls += 1  # every rank makes the same calls in the same order: same keys
        return f"{op}/{self.calls}"

    def allreduce(self, tensors, opts=None):
        if opts is not None and opts.reduceOp.op != dist.ReduceOp.SUM:
            raise ValueError(f"StoreProcessGroup only sums, got {opts.reduceOp.op}")
        for t in tensors:
            self.allreduce_fn(self.store, self.rank(), self.size(), self._key("allreduce"), t)
        return completed(tensors)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        key = self._key("broadcast")
        for i, t in enumerate(tensors):
            if self.rank() == opts.rootRank:
                self.store.set(f"{key}/{i}", to_bytes(t))
            else:
                t.copy_(from_bytes(self.store.get(f"{key}/{i}"), t))
        return completed(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        key = self._key("allgather")
        for i, (outs, t) in enumerate(zip(output_tensors, input_tensors, strict=True)):
            self.store.set(f"{key}/{i}/{self.rank()}", to_bytes(t))
            for r, out in enumerate(outs):
                out.copy_(from_bytes(self.store.get(f"{key}/{i}/{r}"), t))
        return completed(output_tensors)


class _KeyedStore:
    """The store as the learner's function sees it in the checker: keys must contain ``key``."""

    def __init__(self, store, key: str) -> None:
        self._store, self._key = store, key

    def set(self, k: str, value) -> None:
        if self._key not in k:
            raise ValueError(
                f"store key {k!r} does not contain this call's key {self._key!r}: a store keeps "
                "every value, so each call needs its own key (build yours from `key`)"
            )
        self._store.set(k, value)

    def get(self, k: str) -> bytes:
        return self._store.get(k)

    def __getattr__(self, name: str):
        return getattr(self._store, name)


def _checked(fn: Callable) -> Callable:
    def call(store, rank, world_size, key, tensor):
        return fn(_KeyedStore(store, key), rank, world_size, key, tensor)

    return call


def _create(store, rank: int, world_size: int, timeout, allreduce_fn: Callable):
    return StoreProcessGroup(store, rank, world_size, allreduce_fn)


def _value(rank: int, dtype: torch.dtype, shape: tuple, salt: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(97 * salt + rank)
    if dtype == torch.int64:
        return torch.randint(-1000, 1000, shape, generator=gen)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def _run(rank: int, world_size: int) -> list[torch.Tensor]:
    out = []
    for i, (dtype, shape) in enumerate(CASES):
        for repeat in range(2):
            t = _value(rank, dtype, shape, 2 * i + repeat)
            dist.all_reduce(t)
            out.append(t)
    return out


def _sum(world_size: int, dtype: torch.dtype, shape: tuple, salt: int) -> torch.Tensor:
    return sum(_value(r, dtype, shape, salt).double() for r in range(world_size))


def _check_case(world_size: int, got: list[torch.Tensor], case: int, repeat: int) -> None:
    """Every rank's result of one call: right dtype and shape, the sum, identical bits."""
    dtype, shape = CASES[case]
    salt = 2 * case + repeat
    exact = _sum(world_size, dtype, shape, salt)
    what = f"all_reduce #{salt + 1} ({str(dtype).removeprefix('torch.')}{list(shape)}, "
    what += f"{'second' if repeat else 'first'} of two calls with this shape)"
    for rank, t in enumerate(got):
        if t.dtype != dtype or tuple(t.shape) != shape:
            raise ExerciseFailed(f"{what}: rank {rank}'s tensor changed dtype or shape")
        if torch.allclose(t.double(), exact, rtol=1e-5, atol=1e-5):
            continue
        raise ExerciseFailed(
            f"on {world_size} ranks, {what}: rank {rank} holds {t.flatten()[:4].tolist()}…, "
            f"the sum is {exact.flatten()[:4].tolist()}…"
        )
    for rank in range(1, world_size):
        if not torch.equal(got[rank], got[0]):
            raise ExerciseFailed(
                f"on {world_size} ranks, {what}: rank {rank}'s sum differs from rank 0's in the "
                "last bits. Add the ranks' tensors in the same order (0, 1, …) on every rank, "
                "or DDP's replicas slowly drift apart."
            )


def _compare(world_size: int, results: list[list[torch.Tensor]]) -> None:
    for k in range(2 * len(CASES)):
        _check_case(world_size, [r[k] for r in results], k // 2, k % 2)


@exercise("04_minimal_allreduce", reference=store_allreduce, prompt=PROMPT)
def check_minimal_allreduce(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a store-based all-reduce inside a real backend on 2 and 3 ranks.

    Args:
        fn: the learner's ``fn(store, rank, world_size, key, tensor)``, summing in place.

    Returns:
        ``{"world_sizes": [...], "cases": n}``: what was checked.

    Raises:
        ExerciseFailed: a wrong or stale sum, ranks disagreeing in their bits, an error in a
            rank, or ranks waiting forever for a key nobody set.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    creator = functools.partial(_create, allreduce_fn=_checked(fn))
    spec = BackendSpec("store_exercise", creator=creator)
    for world_size in WORLD_SIZES:
        results = launch_learner(
            _run,
            world_size,
            backend=spec,
            args=(),
            timeout_s=TIMEOUT_S,
            device="auto",
            did_not_finish="on {world_size} {ranks} nothing finished within {timeout_s:g} s:",
            hang="a rank waits in store.get for a key no rank sets. Every rank must set its own "
            "key and get the keys of all ranks (0 … p−1), built the same way.",
            stacks=True,
        )
        _compare(world_size, results)
    return {"world_sizes": list(WORLD_SIZES), "cases": 2 * len(CASES)}
