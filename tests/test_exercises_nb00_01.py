"""Tests for labkit/exercises/nb00.py and nb01.py: references pass, wrong answers fail clearly."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb00, nb01

# -- 00_parallel_sum ------------------------------------------------------------------------


def test_parallel_sum_reference_passes() -> None:
    ex = lk.exercises.get("00_parallel_sum")
    assert ex.reference is nb00.parallel_sum
    assert ex.checker(ex.reference) == {"world_sizes": [1, 2, 3], "ns": list(nb00.NS)}


def test_parallel_sum_strided_slices_pass() -> None:
    def strided(rank, world_size, n):
        part = torch.arange(1, n + 1, dtype=torch.int64)[rank::world_size].sum()
        dist.all_reduce(part)
        return part  # a one-element tensor is accepted as the int it holds

    assert lk.exercises.check("00_parallel_sum", strided).status == "passed"


def test_parallel_sum_not_attempted_uses_reference(capsys) -> None:
    def todo(rank, world_size, n):
        raise NotImplementedError("your code here")

    assert lk.exercises.check("00_parallel_sum", todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _sums_everything(rank, world_size, n):
    part = torch.arange(1, n + 1, dtype=torch.int64).sum()
    dist.all_reduce(part)
    return int(part)


def _no_all_reduce(rank, world_size, n):
    lo, hi = rank * n // world_size + 1, (rank + 1) * n // world_size
    return int(torch.arange(lo, hi + 1).sum())


def _drops_remainder(rank, world_size, n):
    k = n // world_size  # the last n % p numbers belong to nobody
    part = torch.arange(rank * k + 1, (rank + 1) * k + 1, dtype=torch.int64).sum()
    dist.all_reduce(part)
    return int(part)


def _all_reduces_a_copy(rank, world_size, n):
    lo, hi = rank * n // world_size + 1, (rank + 1) * n // world_size
    part = torch.arange(lo, hi + 1, dtype=torch.int64).sum()
    dist.all_reduce(part.clone())
    return int(part)


def _float32(rank, world_size, n):
    lo, hi = rank * n // world_size + 1, (rank + 1) * n // world_size
    part = torch.arange(lo, hi + 1, dtype=torch.float32).sum()
    dist.all_reduce(part)
    return part.item()


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (_sums_everything, "Every rank summed all of 1..n"),
        (_no_all_reduce, "never called dist.all_reduce"),
        (_drops_remainder, "slices must cover 1..n exactly once"),
        (_all_reduces_a_copy, "return their all_reduce"),
        (_float32, "float32"),
    ],
)
def test_parallel_sum_wrong_answers_fail(wrong, message) -> None:
    with pytest.raises(ExerciseFailed, match=message) as info:
        lk.exercises.check("00_parallel_sum", wrong)
    assert "expected n(n+1)/2" in str(info.value)


def _formula_only(rank, world_size, n):
    return n * (n + 1) // 2  # right on every rank, and no communication at all


def _formula_after_a_broadcast(rank, world_size, n):
    dist.broadcast(torch.zeros(1), src=0)  # some communication, but no all-reduce
    return n * (n + 1) // 2


def _all_reduces_zeros(rank, world_size, n):
    dist.all_reduce(torch.zeros(1, dtype=torch.int64))  # an all-reduce that carries nothing
    return n * (n + 1) // 2


def _rank0_sums_everything(rank, world_size, n):
    part = (
        torch.arange(1, n + 1, dtype=torch.int64).sum()
        if rank == 0
        else torch.zeros((), dtype=torch.int64)
    )
    dist.all_reduce(part)  # right total, but the other ranks did no work
    return int(part)


def _all_reduce_behind_the_watchers_back(rank, world_size, n):
    lo, hi = rank * n // world_size + 1, (rank + 1) * n // world_size
    part = torch.arange(lo, hi + 1, dtype=torch.int64).sum()
    dist.distributed_c10d.all_reduce(part)
    return int(part)


FORMULA_ONLY = (
    "on 2 ranks, n=1: rank(s) 0, 1 returned 1 without an all-reduce "
    "(the backend recorded: no collective at all)"
)
RANK0_ONLY = "n=100003: rank(s) 0, 1 contributed 5000350006, 0 of 5000350006"


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        (_formula_only, FORMULA_ONLY),
        (_formula_after_a_broadcast, "without an all-reduce (the backend recorded: broadcast)"),
        (_all_reduces_zeros, "handed dist.all_reduce [0.0, 0.0], which add up to 0,"),
        (_rank0_sums_everything, RANK0_ONLY),
        (_all_reduce_behind_the_watchers_back, "without calling dist.all_reduce"),
    ],
)
def test_parallel_sum_right_totals_without_a_real_all_reduce_fail(wrong, message) -> None:
    with pytest.raises(ExerciseFailed) as info:
        lk.exercises.check("00_parallel_sum", wrong)
    assert message in str(info.value)
    assert "on 2 ranks" in str(info.value)  # on 1 rank there is nothing to communicate


def test_parallel_sum_crash_is_reported_with_its_cause() -> None:
    def crashes_on_rank_1(rank, world_size, n):
        if rank == 1:
            raise ValueError("bad slice")
        # Rank 0 waits in all_reduce for rank 1 and may fail too: "Connection closed by peer".
        return nb00.parallel_sum(rank, world_size, n)

    with pytest.raises(ExerciseFailed, match="on 2 rank.*rank 1 raised ValueError: bad slice"):
        lk.exercises.check("00_parallel_sum", crashes_on_rank_1)


# -- 01_ring_exchange -----------------------------------------------------------------------


@pytest.fixture
def short_timeout(monkeypatch):
    monkeypatch.setattr(nb01, "TIMEOUT_S", 3.0)  # deadlocks are detected by the timeout


def test_ring_exchange_reference_passes() -> None:
    ex = lk.exercises.get("01_ring_exchange")
    assert ex.reference is nb01.ring_exchange
    assert ex.checker(ex.reference) == {"world_sizes": [2, 3, 4]}


def test_ring_exchange_batched_passes() -> None:
    def batched(rank, world_size, x):
        left, right = (rank - 1) % world_size, (rank + 1) % world_size
        a, b = torch.empty_like(x), torch.empty_like(x)
        ops = [
            dist.P2POp(dist.isend, x, right),
            dist.P2POp(dist.isend, x, left),
            dist.P2POp(dist.irecv, a, left),
            dist.P2POp(dist.irecv, b, right),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return a, b

    assert lk.exercises.check("01_ring_exchange", batched).status == "passed"


def test_ring_exchange_not_attempted_uses_reference() -> None:
    def todo(rank, world_size, x):
        raise NotImplementedError("your code here")

    assert lk.exercises.check("01_ring_exchange", todo).status == "reference"


def _everyone_sends_first(rank, world_size, x):
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    a, b = torch.empty_like(x), torch.empty_like(x)
    dist.send(x, right)
    dist.send(x, left)
    dist.recv(a, left)
    dist.recv(b, right)
    return a, b


def _even_sends_first(rank, world_size, x):
    # The pair fix: right on even rings, deadlocks on an odd one (ranks p-1 and 0 both even).
    left, right = (rank - 1) % world_size, (rank + 1) % world_size
    a, b = torch.empty_like(x), torch.empty_like(x)
    if rank % 2 == 0:
        dist.send(x, right)
        dist.send(x, left)
        dist.recv(a, left)
        dist.recv(b, right)
    else:
        dist.recv(a, left)
        dist.recv(b, right)
        dist.send(x, right)
        dist.send(x, left)
    return a, b


@pytest.mark.parametrize(("wrong", "ranks"), [(_everyone_sends_first, 2), (_even_sends_first, 3)])
def test_ring_exchange_deadlocks_fail(short_timeout, wrong, ranks) -> None:
    with pytest.raises(ExerciseFailed, match=f"deadlock on {ranks} ranks") as info:
        lk.exercises.check("01_ring_exchange", wrong)
    text = str(info.value)
    assert "dist.isend" in text  # the advice
    # The launcher's report follows; which stack lines it holds is tested with the launcher.
    assert f"--- rank {ranks - 1} (stuck) ---" in text


def _swapped(rank, world_size, x):
    a, b = nb01.ring_exchange(rank, world_size, x)
    return b, a


def _returns_own_x(rank, world_size, x):
    nb01.ring_exchange(rank, world_size, x)
    return x, x


def _returns_x(rank, world_size, x):
    return x


@pytest.mark.parametrize(
    ("wrong", "message"),
    [
        # On 2 ranks left and right are the same rank, so these pass there and fail on 3.
        (_swapped, "on 3 ranks, rank 0's from_left should be rank 2's x but is rank 1's x"),
        (_returns_own_x, "on 2 ranks, rank 0's from_left should be rank 1's x but is rank 0's x"),
        (_returns_x, "on 2 ranks, rank 0 returned tensor("),
    ],
)
def test_ring_exchange_wrong_values_fail(wrong, message) -> None:
    with pytest.raises(ExerciseFailed) as info:
        lk.exercises.check("01_ring_exchange", wrong)
    assert message in str(info.value)
