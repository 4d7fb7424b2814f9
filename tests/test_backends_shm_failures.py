"""labkit_shm under bad input and failing peers: every surviving rank raises a clear error
quickly (the launch's timeout is far shorter than the groups' timeouts, so a backend that
waited instead would end in LaunchTimeout), the group stays usable after a mismatch, and no
``labkit-shm-*`` segment is left in /dev/shm.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.backends._shm import segment
from labkit.backends._shm.layout import Layout
from labkit.backends._shm.sync import PeerWatch

LAUNCH_S = 30.0  # the world group's own timeout is LAUNCH_S + 60 s
# labkit_shm's errors: RuntimeError subclasses (ArgumentError is a ValueError).
ERRORS = ("RuntimeError", "ValueError", "ArgumentError", "MismatchError", "GroupFailure")


def _segments() -> set[str]:
    return {f for f in os.listdir(segment.SHM_DIR) if f.startswith(segment.PREFIX)}


@pytest.fixture(scope="module", autouse=True)
def no_leaked_segments():
    before = _segments()
    yield
    assert _segments() - before == set(), "a labkit_shm segment was left in /dev/shm"


def _fail(fn, world_size: int = 3, args: tuple = ()) -> lk.RankError:
    with pytest.raises(lk.RankError) as info:
        lk.launch(fn, world_size=world_size, backend="labkit_shm", args=args, timeout=LAUNCH_S)
    assert not isinstance(info.value, lk.LaunchTimeout), str(info.value)
    return info.value


def _raised(err: lk.RankError, ranks, *texts: str) -> None:
    """Each of ``ranks`` raised a RuntimeError (or ValueError) whose message has ``texts``."""
    assert sorted(err.failures) == sorted(ranks), str(err)
    for r in ranks:
        f = err.failures[r]
        assert f.kind == "raised" and f.exc_type in ERRORS, str(err)
        for text in texts:
            assert text in f.summary, f"rank {r}: {text!r} not in {f.summary!r}"


def _shape_mismatch(rank, world_size):
    t = torch.ones(12 if rank == 1 else 10)
    dist.all_reduce(t)


def test_mismatched_shapes_raise_on_every_rank():
    err = _fail(_shape_mismatch)
    _raised(err, [0, 1, 2], "all_reduce #1: rank 1 passed float32[12], rank 0 passed float32[10]")


def _dtype_mismatch(rank, world_size):
    dist.barrier()
    t = torch.ones(4, dtype=torch.float64 if rank == 2 else torch.float32)
    dist.broadcast(t, 0)


def test_mismatched_dtypes_raise_on_every_rank():
    err = _fail(_dtype_mismatch)
    _raised(err, [0, 1, 2], "broadcast #2: rank 2 passed float64[4], rank 0 passed float32[4]")


def _kind_mismatch(rank, world_size):
    t = torch.ones(3)
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, 0)


def test_different_collectives_raise_on_every_rank():
    err = _fail(_kind_mismatch, world_size=2)
    _raised(
        err, [0, 1], "collective #1: rank 1 called broadcast(float32[3]), rank 0 called all_reduce"
    )


def _root_mismatch(rank, world_size):
    dist.broadcast(torch.ones(2), src=rank % 2)


def test_different_roots_raise_on_every_rank():
    err = _fail(_root_mismatch)
    _raised(err, [0, 1, 2], "broadcast #1: rank 1 passed root=1, rank 0 passed root=0")


def _bad_dtype(rank, world_size, everyone):
    dt = torch.uint16 if everyone or rank == 1 else torch.int32
    dist.all_reduce(torch.ones(4, dtype=dt))


@pytest.mark.parametrize("everyone", [True, False], ids=["all-ranks", "one-rank"])
def test_unsupported_dtype_says_what_is_supported(everyone):
    err = _fail(_bad_dtype, args=(everyone,))
    _raised(err, [0, 1, 2], "rank 1 passed invalid arguments: cannot reduce uint16", "bfloat16")


def _bad_op(rank, world_size, dtype, op):
    dist.all_reduce(torch.ones(4, dtype=getattr(torch, dtype)), op=getattr(dist.ReduceOp, op))


@pytest.mark.parametrize(
    ("dtype", "op", "text"),
    [
        ("int32", "AVG", "ReduceOp.AVG needs a floating-point dtype, got int32"),
        ("float32", "BXOR", "ReduceOp.BXOR needs an integer or bool dtype, got float32"),
    ],
)
def test_unsupported_op_for_dtype(dtype, op, text):
    err = _fail(_bad_op, world_size=2, args=(dtype, op))
    _raised(err, [0, 1], text)


def _premul(rank, world_size):
    dist.reduce_scatter_tensor(torch.empty(2), torch.ones(4), op=dist._make_nccl_premul_sum(0.5))


def test_premul_sum_is_refused_with_the_supported_ops():
    err = _fail(_premul, world_size=2)
    _raised(err, [0, 1], "unsupported reduce op", "SUM, AVG, PRODUCT, MIN, MAX")


def _still_usable(rank, world_size):
    try:
        dist.all_reduce(torch.ones(5 + rank))
    except RuntimeError as exc:
        caught = str(exc)
    else:
        caught = ""
    t = torch.ones(4) * (rank + 1)
    dist.all_reduce(t)
    return caught, t.tolist()


def test_group_stays_usable_after_a_mismatch():
    res = lk.launch(_still_usable, world_size=3, backend="labkit_shm", timeout=LAUNCH_S)
    for caught, t in res:
        assert "all_reduce #1: rank 1 passed float32[6], rank 0 passed float32[5]" in caught
        assert t == [6.0] * 4


def _split_mismatch(rank, world_size):
    out_rows = [1, 1] if rank == 0 else [2, 1]  # rank 1 expects 2 rows from rank 0, gets 1
    dist.all_to_all_single(torch.empty(sum(out_rows)), torch.ones(2), out_rows, [1, 1])


def test_all_to_all_sizes_must_pair_up():
    err = _fail(_split_mismatch, world_size=2)
    _raised(err, [0, 1], "rank 0 sends 1 element(s) to rank 1, but rank 1 expects 2 from rank 0")


def _recv_size(rank, world_size):
    if rank == 0:
        dist.send(torch.ones(5), 1)
    else:
        dist.recv(torch.empty(4), 0)


def test_recv_of_the_wrong_size_names_both_ranks():
    err = _fail(_recv_size, world_size=2)
    _raised(err, [1], "from rank 0 is float32[5]", "rank 1 posted float32[4]")


def _dies(rank, world_size, where):
    dist.barrier()
    if rank == 1:
        os._exit(3)
    if where == "collective":
        dist.all_reduce(torch.ones(1000))
    else:
        dist.recv(torch.empty(3), 1)


@pytest.mark.parametrize("where", ["collective", "recv"])
def test_a_dead_peer_is_named_by_every_survivor(where):
    err = _fail(_dies, args=(where,))
    assert err.failures[1].kind == "died", str(err)
    survivors = [0, 2] if where == "collective" else [0, 2]
    for r in survivors:
        f = err.failures[r]
        assert f.exc_type in ("RuntimeError", "GroupFailure"), str(err)
        assert "rank 1 (pid" in f.summary and "is gone" in f.summary, f.summary


def _times_out(rank, world_size, what):
    import time

    g = dist.new_group(backend="labkit_shm", timeout=timedelta(seconds=1))
    if rank == 1:
        time.sleep(2.5)  # never joins the collective / never sends
        return None
    try:
        if what == "collective":
            dist.all_reduce(torch.ones(3), group=g)
        else:
            dist.recv(torch.empty(3), 1, group=g)
    except RuntimeError as exc:
        first = str(exc)
    else:
        return "no error"
    try:
        dist.all_reduce(torch.ones(3), group=g)
    except RuntimeError as exc:
        return first, str(exc)
    return first, "no error"


def test_collective_timeout_names_the_op_and_the_missing_rank():
    res = lk.launch(_times_out, world_size=2, args=("collective",), backend="labkit_shm")
    first, then = res[0]
    assert "all_reduce #1 on rank 0: Timed out after 1 s waiting for rank 1" in first, first
    assert "which has not entered any collective" in first, first
    assert "failed earlier" in then, then


def test_recv_timeout_names_the_peer():
    res = lk.launch(_times_out, world_size=2, args=("recv",), backend="labkit_shm")
    first, _ = res[0]
    assert "recv on rank 0 from rank 1 (tag 0, float32[3]): Timed out after 1 s" in first, first


def _name_is_gone(rank, world_size):
    g = dist.new_group(backend="labkit_shm")
    dist.barrier(group=g)
    return g._seg.name, sorted(f for f in os.listdir(segment.SHM_DIR) if g._seg.name in f)


def test_segment_name_is_unlinked_once_every_rank_has_mapped_it():
    res = lk.launch(_name_is_gone, world_size=3, backend="labkit_shm", timeout=LAUNCH_S)
    for name, present in res:
        assert name.startswith(segment.PREFIX) and present == []


class _DictStore:
    """Just enough of a c10d store for one process."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}

    def set(self, key, value) -> None:
        self.data[key] = value.encode() if isinstance(value, str) else value

    def get(self, key) -> bytes:
        return self.data[key]

    def wait(self, keys, timeout=None) -> None:
        assert all(k in self.data for k in keys)


def _exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.parametrize("peer", ["dead", "never-attaches"])
def test_creator_unlinks_when_a_rank_never_attaches(peer):
    pid = _exited_pid() if peer == "dead" else os.getpid()
    watch = PeerWatch(0, [os.getpid(), pid])
    store = _DictStore()
    with pytest.raises(RuntimeError) as info:
        segment.open_segment(store, 0, 2, timedelta(seconds=0.5), watch)
    text = str(info.value)
    assert ("rank 1" in text and "gone" in text) if peer == "dead" else "never attached" in text
    name = store.get("labkit_shm/name").decode()
    assert not os.path.exists(os.path.join(segment.SHM_DIR, name))


def test_segment_is_private_to_its_owner():
    before = _segments()
    mm, name, layout = segment._create(Layout.for_world(2))
    path = os.path.join(segment.SHM_DIR, name)
    try:
        assert _segments() - before == {name}
        st = os.stat(path)
        assert name.startswith(segment.PREFIX)
        assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
        assert st.st_size == layout.total_bytes
    finally:
        segment.unlink_quietly(name)
        mm.close()
