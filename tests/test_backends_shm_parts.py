"""The parts of labkit_shm that need no second process: descriptor checks and their messages,
how chunks are cut into pieces, the segment layout and its fallback when /dev/shm is small.
"""

from __future__ import annotations

import errno
import mmap
import os
import threading
import time

import pytest
import torch

from labkit.backends._shm import futex, segment
from labkit.backends._shm.collectives import pieces
from labkit.backends._shm.describe import (
    KINDS,
    ArgumentError,
    MismatchError,
    OpDesc,
    check_descriptors,
    kind_name,
)
from labkit.backends._shm.layout import Layout


def _ar(numel: int, dtype: str = "float32", **extra) -> OpDesc:
    common = {"dtype": dtype, "numel": numel, "op": "sum", **extra}
    return OpDesc("all_reduce", 7, f"{dtype}[{numel}]", common)


def test_matching_descriptors_pass():
    check_descriptors([_ar(10), _ar(10), _ar(10)])


def test_a_different_size_names_both_ranks_and_tensors():
    with pytest.raises(MismatchError) as info:
        check_descriptors([_ar(10), _ar(12), _ar(10)])
    assert str(info.value).startswith(
        "all_reduce #7: rank 1 passed float32[12], rank 0 passed float32[10]"
    )


def test_a_different_op_or_root_is_named_by_its_field():
    other = _ar(10)
    other.common["op"] = "max"
    with pytest.raises(MismatchError, match="rank 2 passed op=max, rank 0 passed op=sum"):
        check_descriptors([_ar(10), _ar(10), other])


def test_ranks_at_different_collectives_or_positions():
    bcast = OpDesc("broadcast", 7, "float32[10]", {"dtype": "float32", "numel": 10, "root": 0})
    with pytest.raises(MismatchError, match=r"rank 1 called broadcast\(float32\[10\]\)"):
        check_descriptors([_ar(10), bcast])
    late = _ar(10)
    late.seq = 8
    with pytest.raises(MismatchError, match="rank 1 is at collective #8"):
        check_descriptors([_ar(10), late])


def test_invalid_arguments_of_any_rank_are_raised_everywhere():
    bad = _ar(10)
    bad.error = "cannot reduce uint16 tensors"
    with pytest.raises(ArgumentError, match="rank 2 passed invalid arguments: cannot reduce"):
        check_descriptors([_ar(10), _ar(10), bad])


def test_all_to_all_sizes_must_pair_up():
    a = OpDesc("all_to_all_single", 1, "", {"dtype": "float32"}, sends=[1, 2], recvs=[1, 5])
    b = OpDesc("all_to_all_single", 1, "", {"dtype": "float32"}, sends=[5, 1], recvs=[3, 1])
    with pytest.raises(MismatchError, match="rank 0 sends 2 element.s. to rank 1, but rank 1"):
        check_descriptors([a, b])
    b.recvs = [2, 1]
    check_descriptors([a, b])


def test_descriptors_round_trip_and_survive_garbage():
    d = OpDesc("all_to_all", 3, "int8[4]", {"dtype": "int8"}, [1, 2], [3, 4], "")
    assert OpDesc.decode(d.encode()) == d
    assert OpDesc.decode(b"\x00garbage").seq == -1
    assert kind_name(1) == KINDS[0] and "unknown" in kind_name(99)


@pytest.mark.parametrize("m", [0, 1, 7, 64, 1000, 1023])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_pieces_cover_the_chunk_in_order_with_aligned_starts(m, n):
    bounds = pieces(m, n, 16)
    assert len(bounds) == n and bounds[0][0] == 0 and bounds[-1][1] == m
    for (lo, hi), (lo2, _) in zip(bounds, bounds[1:], strict=False):
        assert hi == lo2 and lo <= hi
    assert all(lo % 16 == 0 or lo == m for lo, _ in bounds)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16])
def test_layout_regions_are_aligned_and_disjoint(n):
    lay = Layout.for_world(n)
    starts = [lay.lines_off, lay.wr_off, lay.rd_off, lay.desc_off, lay.slots_off, lay.mail_off]
    assert starts == sorted(starts) and all(s % 64 == 0 for s in starts)
    assert lay.slots_off % 4096 == 0 and lay.slot_bytes % 4096 == 0
    assert lay.mailbox_at(n - 1, n - 1) + lay.mail_bytes == lay.total_bytes
    assert lay.total_bytes < 128 << 20  # a few groups fit in a laptop's /dev/shm


def test_sizes_can_be_set_by_environment(monkeypatch):
    monkeypatch.setenv("LABKIT_SHM_SLOT_BYTES", "8192")
    monkeypatch.setenv("LABKIT_SHM_MAIL_BYTES", "4096")
    lay = Layout.for_world(3)
    assert (lay.slot_bytes, lay.mail_bytes) == (8192, 4096)


def test_a_small_dev_shm_gets_smaller_slots_then_a_clear_error(monkeypatch):
    limit = {"bytes": 6 << 20}

    def fallocate(fd, offset, length):
        if length > limit["bytes"]:
            raise OSError(errno.ENOSPC, "No space left on device")
        os.ftruncate(fd, length)

    monkeypatch.setattr(segment.os, "posix_fallocate", fallocate)
    before = _segments()
    try:
        mm, name, lay = segment._create(Layout.for_world(4))
        segment.unlink_quietly(name)
        mm.close()
        assert lay.total_bytes <= limit["bytes"] < Layout.for_world(4).total_bytes
        limit["bytes"] = 256 << 10  # not even the smallest layout fits
        with pytest.raises(RuntimeError, match="--shm-size"):
            segment._create(Layout.for_world(4))
        assert _segments() == before  # the failed attempt removed its file
    finally:
        for name in _segments() - before:
            segment.unlink_quietly(name)


def _segments() -> set[str]:
    return {f for f in os.listdir(segment.SHM_DIR) if f.startswith(segment.PREFIX)}


needs_futex = pytest.mark.skipif(not futex.AVAILABLE, reason="no futexes on this platform")


def _word() -> tuple[mmap.mmap, torch.Tensor, int]:
    mm = mmap.mmap(-1, 4096)  # shared, like a segment
    words = torch.frombuffer(mm, dtype=torch.int64)
    return mm, words, words.data_ptr()


@needs_futex
def test_futex_wait_returns_when_the_word_no_longer_holds_the_value():
    _mm, words, addr = _word()
    words[0] = 5
    futex.wait(addr, 4, futex.timespec(60.0))  # 5 != 4: returns at once instead of sleeping
    words[0] = (7 << 32) + 3  # only the low 32 bits count
    futex.wait(addr, 2, futex.timespec(60.0))
    futex.wait(addr, 3, futex.timespec(0.001))  # holds 3: sleeps until the timeout


@needs_futex
def test_futex_wake_ends_a_wait_of_another_thread():
    _mm, words, addr = _word()
    done = threading.Event()

    def sleeper():
        while words[0] == 0:
            futex.wait(addr, 0, futex.timespec(60.0))
        done.set()

    t = threading.Thread(target=sleeper, daemon=True)
    t.start()
    time.sleep(0.05)  # let it block (if it has not yet, its wait returns at once)
    words[0] = 1
    futex.wake(addr)
    assert done.wait(30.0), "the sleeping thread was not woken"
    t.join()
