"""The calibration's microbenchmarks run in seconds and give every term of the machine model."""

from __future__ import annotations

import time

import pytest

import labkit as lk
from labkit.costmodel.calibrate import machine_from_probes
from labkit.costmodel.recipes import OPS


def test_fast_calibration_measures_every_term():
    t0 = time.perf_counter()
    probes = lk.bench.measure_probes(["labkit_shm"], (2,), fast=True)
    seconds = time.perf_counter() - t0
    machine = machine_from_probes(probes, "min")
    assert seconds < 60  # a few seconds on a quiet 2-core machine
    assert {b.name for b in probes.backends} == {"labkit_shm"}  # gloo measured the machine only
    shm = machine.backend("labkit_shm")
    assert shm.alpha > 0 and shm.beta > 0 and shm.duplex >= 1
    assert set(shm.overhead_s) == {(op, 2) for op in OPS}
    assert shm.round_s[2] > 0 and shm.chunk_bytes[2] >= 64 << 10  # a slot per round
    assert {op for op, _ in shm.sync_s} == {*OPS[:3], "p2p"}  # between bursts of compute
    assert set(machine.copy_s_per_byte) == {1, 2} and set(machine.add_s_per_byte) == {1, 2}
    assert all(r > 0 for t in machine.copy_s_per_byte.values() for r in t.values())
    assert machine.compute_share_at(2) >= 1.0 and machine.compute_share_at(1) >= 1.0
    t = lk.costmodel.predict_collective(machine, "labkit_shm", "all_reduce", 1 << 20, 2)
    assert t > shm.overhead("all_reduce", 2)


def test_unknown_backend_is_refused_before_launching():
    with pytest.raises(ValueError, match="no recipes"):
        lk.bench.measure_probes(["nccl"], (2,))
