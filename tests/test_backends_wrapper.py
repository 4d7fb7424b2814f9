"""Tests for labkit/backends/_wrapper.py and _opcall.py: the hooks a wrapping backend gets.

A subclass that logs ``before_op`` / ``after_op`` / completion must see every op in that order,
the Work its ``after_op`` returns must be the one the caller gets, and ``when_complete`` must
fire for works with a future (collectives) and without one (gloo's send/recv).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.backends._inner import create_inner
from labkit.backends._opcall import OpCall, when_complete
from labkit.backends._wrapper import WrapperProcessGroup

LOG: list[tuple[str, str]] = []  # per rank process


class _Completed(dist.Work):
    """Stands for a Work a subclass makes itself (e.g. one that completes later)."""

    def __init__(self, inner: dist.Work) -> None:
        super().__init__()
        self.inner = inner

    def wait(self, timeout=None) -> bool:  # noqa: ARG002
        return self.inner.wait()

    def get_future(self):
        return self.inner.get_future()


class LoggingPG(WrapperProcessGroup):
    backend_name = "logging"

    def before_op(self, call: OpCall) -> None:
        LOG.append(("before", call.op))

    def after_op(self, call: OpCall, work: dist.Work) -> dist.Work:
        LOG.append(("after", call.op))
        work = when_complete(work, lambda: LOG.append(("done", call.op)))
        return _Completed(work) if call.op == "broadcast" else work


def _create(opts, _backend_opts=None) -> LoggingPG:
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    inner = create_inner(
        "gloo", opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks, opts.group_id
    )
    return LoggingPG(inner, ranks)


SPEC = lk.BackendSpec("logging", creator=_create, extended_api=True)


def _ops(rank: int, world_size: int) -> dict:
    t = torch.ones(4)
    dist.all_reduce(t)
    work = dist.broadcast(t, src=0, async_op=True)
    custom = isinstance(work, _Completed)
    work.wait()
    peer = 1 - rank
    send_work = dist.isend(torch.ones(2), peer) if rank == 0 else dist.irecv(torch.empty(2), peer)
    before_wait = list(LOG)
    send_work.wait()
    time.sleep(0.05)  # let completion callbacks that wait for the GIL run
    return {
        "log": list(LOG),
        "p2p_done_before_wait": ("done", "send" if rank == 0 else "recv") in before_wait,
        "custom_work_reached_caller": custom,
        "name": dist.group.WORLD.name(),
        "group_name": dist.group.WORLD.group_name,
        "result": t.tolist(),
    }


@pytest.fixture(scope="module")
def out() -> list[dict]:
    return lk.launch(_ops, world_size=2, backend=SPEC, timeout=60)


def test_hooks_run_before_and_after_every_op_then_completion(out) -> None:
    for rank in range(2):
        p2p = "send" if rank == 0 else "recv"
        log = out[rank]["log"]
        for op in ("all_reduce", "broadcast", p2p):
            i, j, k = (log.index((stage, op)) for stage in ("before", "after", "done"))
            assert i < j < k, (op, log)
        assert out[rank]["result"] == [2.0] * 4


def test_p2p_completion_is_reported_when_the_caller_waits(out) -> None:
    assert not any(o["p2p_done_before_wait"] for o in out)


def test_the_work_after_op_returns_is_the_callers(out) -> None:
    assert all(o["custom_work_reached_caller"] for o in out)


def test_identity_is_the_wrappers(out) -> None:
    assert out[0]["name"] == "logging"
    assert out[0]["group_name"] == out[1]["group_name"] == "0"


def _unknown_inner(rank: int, world_size: int) -> None:
    store = dist.distributed_c10d._get_default_store()
    create_inner("no_such", store, rank, world_size, dist.default_pg_timeout)


def test_unknown_inner_backend_names_the_choices() -> None:
    with pytest.raises(lk.RankError, match="labkit_shm"):
        lk.launch(_unknown_inner, world_size=1, backend="gloo", timeout=60)


def test_global_ranks_must_match_the_group_size() -> None:
    inner = dist.ProcessGroup(0, 2)
    with pytest.raises(ValueError, match="3 global ranks for a group of 2"):
        WrapperProcessGroup(inner, [0, 1, 2])


def test_op_call_defaults() -> None:
    call = OpCall("barrier", "barrier", [], [], 0, "", (0, 1))
    assert call.peer is None and call.root is None and call.start_ns == 0
