"""The hand-off probe: a round between two ranks through shared memory, timed, and nothing left."""

from __future__ import annotations

import os
import statistics
import time

import pytest

import labkit as lk
from labkit.backends._shm.segment import SHM_DIR
from labkit.bench_handoff import _wait, handoff


def _leftovers() -> set[str]:
    return {f for f in os.listdir(SHM_DIR) if f.startswith("labkit-handoff-")}


def probe(rank: int, world: int, a: int, b: int):
    import torch

    torch.set_num_threads(1)
    return handoff(64 << 10, reps=5, a=a, b=b)


@pytest.mark.parametrize(
    ("backend", "world", "a", "b"), [("gloo", 2, 0, 1), ("gloo", 3, 2, 0), ("labkit_shm", 2, 1, 0)]
)
def test_the_round_is_timed_on_a_and_the_other_ranks_get_none(backend, world, a, b):
    before = _leftovers()
    got = lk.launch(probe, world, backend=backend, args=(a, b))
    assert [r is None for r in got] == [r != a for r in range(world)]
    out = got[a]
    assert set(out) == {"n_bytes", "round_s", "private_s"} and out["n_bytes"] == 64 << 10
    assert len(out["round_s"]) == len(out["private_s"]) == 5  # reps, the first round dropped
    # a round is two copies of the bytes and two flags: never below one private copy
    assert 0 < statistics.median(out["private_s"]) <= statistics.median(out["round_s"]) < 1.0
    assert _leftovers() <= before  # the file is unlinked once both ranks have it mapped


def bad(rank: int, world: int) -> list[str]:
    msgs = []
    for kwargs in ({"a": 1, "b": 1}, {"b": 2}, {"n_bytes": 0}, {"reps": 0}):
        with pytest.raises(ValueError, match="two different ranks") as e:
            handoff(**kwargs)
        msgs.append(str(e.value))
    return msgs


def test_bad_arguments_are_refused_on_every_rank_before_any_communication():
    got = lk.launch(bad, 2, backend="gloo")
    assert got[0] == got[1] and "a=1, b=1" in got[0][0]


def test_a_peer_that_never_answers_ends_in_an_error_naming_both_ranks():
    words = memoryview(bytearray(64)).cast("q")
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError, match=r"rank 1 waited for rank 0 .*round 3"):
        _wait(words, 0, 3, time.monotonic() + 0.05, rank=1, who=0)
    assert time.perf_counter() - t0 < 5
