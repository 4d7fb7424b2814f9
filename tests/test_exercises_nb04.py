"""Tests for labkit/exercises/nb04.py: the reference passes, wrong answers fail with a reason."""

from __future__ import annotations

import functools

import pytest
import torch

import labkit as lk
from labkit.exercises import ExerciseFailed, nb04

NAME = "04_minimal_allreduce"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb04.store_allreduce
    assert ex.checker(ex.reference) == {"world_sizes": [2, 3], "cases": 10}


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(store, rank, world_size, key, tensor):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _own_order(store, rank, world_size, key, tensor):
    """Right sum, but each rank starts from its own tensor: bits differ between ranks."""
    store.set(f"{key}/{rank}", nb04.to_bytes(tensor))
    total = tensor.clone()
    for i in range(1, world_size):
        total += nb04.from_bytes(store.get(f"{key}/{(rank + i) % world_size}"), tensor)
    tensor.copy_(total)


def _fixed_key(store, rank, world_size, key, tensor):
    """Ignores ``key``: a later call would read an earlier call's values back."""
    nb04.store_allreduce(store, rank, world_size, "sum", tensor)


def _no_communication(store, rank, world_size, key, tensor):
    tensor.mul_(world_size)  # "everyone has the same tensor" is not what all-reduce assumes


def _waits_for_a_missing_key(store, rank, world_size, key, tensor):
    store.set(f"{key}/{rank}", nb04.to_bytes(tensor))
    store.get(f"{key}/{world_size}")  # there is no rank p


def _raises(store, rank, world_size, key, tensor):
    raise ValueError("boom")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_own_order, "differs from rank 0's in the last bits"),
        (_fixed_key, "each call needs its own key"),
        (_no_communication, "the sum is"),
        (_raises, "ValueError: boom"),
    ],
)
def test_wrong_answers_fail_with_the_reason(fn, message: str) -> None:
    with pytest.raises(ExerciseFailed, match=message):
        lk.exercises.check(NAME, fn)


def test_a_deadlock_is_reported_as_a_missing_key(monkeypatch) -> None:
    monkeypatch.setattr(nb04, "TIMEOUT_S", 5.0)
    with pytest.raises(ExerciseFailed, match="waits in store.get for a key no rank sets"):
        lk.exercises.check(NAME, _waits_for_a_missing_key)


def test_bytes_round_trip_every_dtype() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool, torch.float16):
        t = (torch.arange(6) % 3).to(dtype).reshape(2, 3)
        back = nb04.from_bytes(nb04.to_bytes(t.t()), t.t())  # non-contiguous input
        assert back.dtype == dtype and back.shape == (3, 2) and torch.equal(back, t.t())


def _ddp_on_store(rank: int, world_size: int) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(rank)
    ddp(torch.randn(3, 4)).sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_store_process_group_runs_ddp_like_gloo() -> None:
    creator = functools.partial(nb04._create, allreduce_fn=nb04.store_allreduce)
    spec = lk.BackendSpec("store_pg_test", creator=creator)
    got = lk.launch(_ddp_on_store, world_size=2, backend=spec, timeout=60)
    want = lk.launch(_ddp_on_store, world_size=2, backend="gloo", timeout=60)
    for g, w in zip(got[0] + got[1], want[0] + want[1], strict=True):
        assert torch.equal(g, w)  # two ranks: a + b either way
