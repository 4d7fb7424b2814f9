"""Every exchange step of labkit's all-reduce algorithms is one ``dist.batch_isend_irecv``.

NCCL creates the two-rank communicator of a peer pair lazily and blocks while doing so, so
an ``irecv(left)`` and an ``isend(right)`` issued as separate operations on p ≥ 3 ranks leave
each rank waiting on a different pair: a cycle. Issued as one batch, NCCL coalesces them.
These tests wrap ``torch.distributed``'s point-to-point calls on every rank and record what
each algorithm actually issues; the sends must be the messages ``count_messages`` counted.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import labkit as lk
from labkit.collectives import ALGORITHMS

NUMEL = 11  # not divisible by 2, 3, 4 or 5: uneven chunks


@contextmanager
def _record_p2p(calls: list[tuple]) -> Iterator[None]:
    """Record every batch and every point-to-point call made outside a batch."""
    depth = [0]  # > 0 inside a recorded call: its inner calls (send → isend) are part of it
    saved: list[tuple[Any, str, Any]] = []

    def single(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(original)

        def call(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                bound = sig.bind(*args, **kwargs).arguments
                peer = next(
                    bound[k]
                    for k in ("group_dst", "group_src", "dst", "src")
                    if bound.get(k) is not None
                )
                calls.append((name, peer, bound["tensor"].numel()))
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        return call

    original_batch = c10d.batch_isend_irecv

    def batch(ops: list[dist.P2POp]) -> list[dist.Work]:
        kinds = [
            ("send" if op.op is c10d.isend else "recv", op.group_peer, op.tensor.numel())
            for op in ops
        ]
        calls.append(("batch", tuple(kinds)))
        depth[0] += 1
        try:
            return original_batch(ops)
        finally:
            depth[0] -= 1

    # P2POp and batch_isend_irecv compare ops with c10d's isend/irecv: wrap both namespaces.
    wrapped = {
        name: single(name, getattr(c10d, name)) for name in ("send", "recv", "isend", "irecv")
    }
    wrapped["batch_isend_irecv"] = batch
    for module in (dist, c10d):
        for name, fn in wrapped.items():
            saved.append((module, name, getattr(module, name)))
            setattr(module, name, fn)
    try:
        yield
    finally:
        for module, name, fn in reversed(saved):
            setattr(module, name, fn)


def _issued(rank: int, world_size: int) -> dict[str, dict]:
    out = {}
    for name, fn in ALGORITHMS.items():
        x = torch.arange(NUMEL, dtype=torch.float32) + rank
        want = x.clone()
        dist.all_reduce(want)
        calls: list[tuple] = []
        with lk.collectives.count_messages() as stats, _record_p2p(calls):
            fn(x, check=False)  # no input check: only the algorithm's own messages
        out[name] = {
            "calls": calls,
            "sent": [(m.peer, m.numel) for m in stats.messages if m.direction == "send"],
            "ok": torch.equal(x, want),
        }
    return out


@functools.cache
def _results(world_size: int) -> list[dict]:
    return lk.launch(_issued, world_size=world_size, backend="gloo", device="cpu", timeout=120)


def _sends_issued(calls: list[tuple]) -> list[tuple[int, int]]:
    sends = []
    for call in calls:
        if call[0] == "batch":
            sends += [(peer, numel) for kind, peer, numel in call[1] if kind == "send"]
        elif call[0] in ("send", "isend"):
            sends.append((call[1], call[2]))
    return sends


@pytest.mark.parametrize("world_size", (3, 4, 5))
def test_no_exchange_is_issued_as_separate_operations(world_size):
    for rank, res in enumerate(_results(world_size)):
        for name, row in res.items():
            assert row["ok"], (rank, name)
            bare = [c for c in row["calls"] if c[0] in ("isend", "irecv")]
            assert not bare, f"rank {rank} {name} issued {bare} outside a batch"
            for call in row["calls"]:
                if call[0] == "batch" and name != "naive":  # naive: rank 0's p−1 sends
                    assert sorted(kind for kind, _, _ in call[1]) == ["recv", "send"], call
            # What was issued is what was counted: the same sends, peers and sizes.
            assert _sends_issued(row["calls"]) == row["sent"], (rank, name)


@pytest.mark.parametrize("world_size", (3, 4))
def test_ring_issues_one_batched_pair_per_step(world_size):
    p = world_size
    chunks = lk.collectives.chunk_sizes(NUMEL, p)
    for r, res in enumerate(_results(world_size)):
        calls = res["ring"]["calls"]
        assert len(calls) == 2 * (p - 1) and all(c[0] == "batch" for c in calls)
        right, left = (r + 1) % p, (r - 1) % p
        for step, (_, ops) in enumerate(calls[: p - 1]):  # reduce-scatter
            send, recv = ops
            assert send == ("send", right, chunks[(r - step - 1) % p])
            assert recv == ("recv", left, chunks[(r - step - 2) % p])


def test_power_of_two_exchanges_pair_with_the_partner():
    p = 4
    for r, res in enumerate(_results(p)):
        rd = res["recursive_doubling"]["calls"]
        assert [c[0] for c in rd] == ["batch"] * 2
        assert [{peer for _, peer, _ in ops} for _, ops in rd] == [{r ^ 1}, {r ^ 2}]
        rab = res["rabenseifner"]["calls"]
        assert [c[0] for c in rab] == ["batch"] * 4
        assert [{peer for _, peer, _ in ops} for _, ops in rab] == [
            {r ^ 2},
            {r ^ 1},
            {r ^ 1},
            {r ^ 2},
        ]


def test_fold_steps_are_single_messages():
    """p = 5: rank 0 folds into rank 1 (one send) and gets the result back (one receive)."""
    res = _results(5)
    for name in ("recursive_doubling", "rabenseifner"):
        assert [c[0] for c in res[0][name]["calls"]] == ["send", "recv"]
        calls = res[1][name]["calls"]
        assert calls[0][:2] == ("recv", 0) and calls[-1][:2] == ("send", 0)
