"""The calibration's microbenchmarks run in seconds and give every term of the machine model."""

from __future__ import annotations

import time

import pytest

import labkit as lk
from labkit.bench_between import HOPS, WAKE_OPS, WAKE_SIZES
from labkit.bench_calibrate import add_launch
from labkit.costmodel.calibrate import Probes, machine_from_probes
from labkit.costmodel.recipes import OPS


def where(rank: int, world_size: int) -> tuple[int, int]:
    return rank, world_size


def test_fast_calibration_measures_every_term():
    t0 = time.perf_counter()
    after: dict = {}
    probes = lk.bench.measure_probes(["labkit_shm"], (2,), fast=True, then=where, results=after)
    seconds = time.perf_counter() - t0
    assert after == {("labkit_shm", 2): (0, 2)}  # run in the calibrated backend's launch only
    machine = machine_from_probes(probes, "min")
    assert seconds < 60  # a few seconds on a quiet 2-core machine
    assert {b.name for b in probes.backends} == {"labkit_shm"}  # gloo measured the machine only
    shm = machine.backend("labkit_shm")
    assert shm.alpha > 0 and shm.beta > 0 and shm.duplex >= 1
    assert set(shm.overhead_s) == {(op, 2) for op in OPS}
    assert shm.round_s[2] > 0 and shm.chunk_bytes[2] >= 64 << 10  # a slot per round
    # between bursts of compute; p2p_busy: the hop while every rank computes
    assert {op for op, _ in shm.sync_s} == {*OPS[:3], "p2p", "p2p_busy"}
    # and at the sizes a step's calls have: on 2 ranks no pairs inside a larger world
    assert set(shm.wake_s) == {(op, 2) for op in (*WAKE_OPS, *HOPS)}
    assert shm.cpu_s == {}  # the CPU of pairs' calls: inside a larger world only
    # the hand-off between ranks 0 and 1, in the backend's own launch: 1 MiB, a round per rep
    ((key, (rounds, private)),) = probes.backends[0].handoff.items()
    assert key == (2, 1 << 20) and len(rounds) == len(private) == 10
    assert set(shm.handoff_s) == {2} and shm.handoff_s[2] >= 0
    assert all(set(shm.wake_s[(op, 2)]) == {8, *WAKE_SIZES} for op in WAKE_OPS)
    assert all(set(shm.wake_s[(op, 2)]) == {4, *WAKE_SIZES} for op in HOPS)  # one float
    for op in WAKE_OPS:  # priced there as measured, never below back to back
        between = lk.costmodel.predict_collective(machine, "labkit_shm", op, 1 << 20, 2, True)
        assert between >= lk.costmodel.predict_collective(machine, "labkit_shm", op, 1 << 20, 2)
    assert set(machine.copy_s_per_byte) == {1, 2} and set(machine.add_s_per_byte) == {1, 2}
    assert all(r > 0 for t in machine.copy_s_per_byte.values() for r in t.values())
    assert machine.compute_share_at(2) >= 1.0 and machine.compute_share_at(1) >= 1.0
    t = lk.costmodel.predict_collective(machine, "labkit_shm", "all_reduce", 1 << 20, 2)
    assert t > shm.overhead("all_reduce", 2)


def test_unknown_backend_is_refused_before_launching():
    with pytest.raises(ValueError, match="no recipes"):
        lk.bench.measure_probes(["nccl"], (2,))


def one_launch(scale: float) -> dict:
    """What probe_rank returns on 2 ranks, every sample ``scale``."""
    rows = [(8, [scale]), (1 << 20, [2 * scale])]
    return {
        "tiny": {"all_reduce": [scale], "barrier": [scale]},
        "between": {"all_reduce": ([2 * scale], [scale])},
        "chunk_bytes": 0,
        "p2p": rows,
        "exchange": [(1 << 20, [3 * scale], [2 * scale])],
        "machine": {
            "copy": {1 << 20: ([scale], [2 * scale])},
            "add": {1 << 20: ([scale], [3 * scale])},
            "compute": ([scale], [2 * scale]),
        },
    }


def test_add_launch_pools_the_samples_of_several_launches():
    probes = Probes(cores=2)
    add_launch(probes, "gloo", 2, one_launch(1.0))
    add_launch(probes, "gloo", 2, one_launch(10.0))
    (bp,) = probes.backends
    assert bp.tiny[("all_reduce", 2)] == [1.0, 10.0]
    assert bp.between[("all_reduce", 2)] == ([2.0, 20.0], [1.0, 10.0])
    assert bp.p2p == [(8, [1.0, 10.0]), (1 << 20, [2.0, 20.0])]
    assert bp.exchange == [(1 << 20, [3.0, 30.0], [2.0, 20.0])]
    assert probes.copy == {1: [(1 << 20, [1.0, 10.0])], 2: [(1 << 20, [2.0, 20.0])]}
    assert probes.add[2] == [(1 << 20, [3.0, 30.0])]
    assert probes.compute_share[2] == ([1.0, 10.0], [2.0, 20.0])
    assert probes.compute_share[1] == ([1.0, 10.0], [1.0, 10.0])  # one rank alone, every launch
    m = machine_from_probes(probes, "min")  # the fastest of both launches
    assert m.copy_rate(2, 1 << 20) == 2.0 / (1 << 20)
    assert m.backend("gloo").overhead("all_reduce", 2) == 1.0


def test_add_launch_pools_the_sized_calls_by_group_and_world():
    probes = Probes(cores=2)
    for scale in (1.0, 10.0):
        launch = one_launch(scale)
        launch["sized"] = {
            ("all_reduce", 1 << 17, 4): ([3 * scale], [scale]),
            ("all_reduce", 1 << 17, 2): ([2 * scale], [scale]),
        }
        launch["sized_cpu"] = {("all_reduce", 1 << 17, 2): ([scale / 2], [scale / 4])}
        add_launch(probes, "gloo", 4, launch)
    (bp,) = probes.backends
    assert bp.sized == {
        ("all_reduce", 4, 1 << 17, 4): ([3.0, 30.0], [1.0, 10.0]),
        ("all_reduce", 2, 1 << 17, 4): ([2.0, 20.0], [1.0, 10.0]),  # pairs inside 4 ranks
    }
    assert bp.sized_cpu == {("all_reduce", 2, 1 << 17, 4): ([0.5, 5.0], [0.25, 2.5])}


def cpu_of_calls(rank: int, world_size: int) -> dict:
    """``_per_iteration``'s CPU seconds of a call that sleeps 3 ms and one that works 3 ms."""
    from labkit.bench_between import _per_iteration

    def work() -> None:
        t0 = time.process_time()
        while time.process_time() - t0 < 3e-3:
            pass

    used: dict = {}
    wall = _per_iteration({"sleep": lambda: time.sleep(3e-3), "work": work}, 3, 3, used)
    return {"wall": wall, "cpu": used}


def test_the_cpu_a_call_costs_is_its_processes_cpu_time_not_its_wait():
    got = lk.launch(cpu_of_calls, 2, backend="gloo")[0]
    assert all(len(v) == 3 for v in got["cpu"].values())  # a sample per rep
    assert min(got["cpu"]["work"]) >= 3e-3  # the mean over both ranks, each ≥ 3 ms
    assert max(got["cpu"]["sleep"]) < 1e-3  # waiting costs the CPU (almost) nothing
    assert min(got["wall"]["sleep"]) >= 3e-3
