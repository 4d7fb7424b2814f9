"""Tests for labkit/backends/simlink.py: gloo's results, and operations queued on one link.

Only lower bounds on time: the backend guarantees that an operation does not finish before
the link has carried every earlier one (a busy machine can only make things slower).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.backends import simlink
from labkit.costmodel import Network, predict

SLOW = Network(latency_us=1000.0, bandwidth_gbps=0.01, name="slow")  # 1 MB ring on 2: ~100 ms
N = 100_000  # floats per all-reduce: 400 KB, ~41 ms each on SLOW with 2 ranks


def _summed(rank: int, world_size: int) -> list[torch.Tensor]:
    out = []
    for k in range(3):
        t = torch.arange(12, dtype=torch.float32) * (rank + 1) + k
        dist.all_reduce(t)
        out.append(t)
    return out


def test_results_identical_to_gloo() -> None:
    got = lk.launch(_summed, 2, backend=simlink.spec(SLOW), timeout=60)
    want = lk.launch(_summed, 2, backend="gloo", timeout=60)
    for g, w in zip(got, want, strict=True):
        for a, b in zip(g, w, strict=True):
            assert torch.equal(a, b)


def _three_at_once(rank: int, world_size: int) -> tuple[float, str]:
    bufs = [torch.ones(N) for _ in range(3)]
    dist.barrier()
    start = time.perf_counter()
    works = [dist.all_reduce(b, async_op=True) for b in bufs]
    for w in works:
        w.wait()
    assert all(torch.equal(b, torch.full((N,), 2.0)) for b in bufs)
    return time.perf_counter() - start, type(dist.group.WORLD).__name__


def test_operations_in_flight_together_take_the_sum_of_their_times() -> None:
    one = predict("all_reduce", 4 * N, 2, SLOW)
    for took, group in lk.launch(_three_at_once, 2, backend=simlink.spec(SLOW), timeout=60):
        assert group == "SerialLinkProcessGroup"
        assert took >= 3 * one * 0.999  # simnet alone would let them finish in ~one


def test_recorded_over_simlink_ops_do_not_overlap_on_the_link() -> None:
    def ops(rank: int, world_size: int) -> list[tuple[int, int]]:
        from labkit.backends import recording

        works = [dist.all_reduce(torch.ones(N), async_op=True) for _ in range(3)]
        for w in works:
            w.wait()
        time.sleep(0.05)  # let the last completion callback run
        return [(r.start_ns, r.end_ns) for r in recording.records() if r.op == "all_reduce"]

    spec = lk.backends.recording.spec(simlink.spec(SLOW))
    one_ns = predict("all_reduce", 4 * N, 2, SLOW) * 1e9
    for rows in lk.launch(ops, 2, backend=spec, timeout=60):
        ends = [end for _, end in rows]
        assert len(rows) == 3 and None not in ends
        first_start = min(start for start, _ in rows)
        for k, end in enumerate(sorted(ends)):
            assert end - first_start >= (k + 1) * one_ns * 0.999


def test_spec_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown network preset"):
        simlink.spec("carrier pigeon")
    with pytest.raises(ValueError, match="no algorithm"):
        simlink.spec("10GbE", algorithms={"all_reduce": "telepathy"})
    with pytest.raises(ValueError, match="inner must be"):
        simlink.spec("10GbE", inner=3)  # type: ignore[arg-type]
    assert simlink.spec("10GbE").name == "labkit_simlink_gloo"
