"""A strategy's own code timed on one process inside torch's fake process group."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.bench_framework import model_without_comm_s, strategy_step_s
from labkit.plan_time import collective_counts
from labkit.plan_workload import framework_key

cap = lk.capstone
CONFIG = cap.RunConfig(dim=32, n_layers=2, n_heads=2, seq_len=16, batch=8, steps=4)


@pytest.fixture(scope="module")
def work():
    return lk.bench.capstone_workload(CONFIG, reps=2)


def test_sharded_strategies_cost_more_than_their_layers_and_the_process_is_left_clean(work):
    threads = torch.get_num_threads()
    dp = cap.Strategy.parse("dp", 2)
    fsdp = cap.Strategy.parse("fsdp", 2)
    got = {s.name: strategy_step_s(s, CONFIG, reps=2) for s in (dp, fsdp)}
    assert not dist.is_initialized() and torch.get_num_threads() == threads
    # FSDP2's hooks, DTensors and copies around every unit: more than plain DP's step, which
    # the layers, Adam and the step's other Python already price (within noise)
    assert got["fsdp"] > 1.5 * got["dp"]
    assert got["fsdp"] > model_without_comm_s(work, fsdp.dims, 3, True, 1)


def test_framework_costs_fill_the_strategies_and_the_flavours_per_call_cost(work):
    zero1, tp = cap.Strategy.parse("zero1", 2), cap.Strategy.parse("tp", 2)
    out = lk.bench.framework_costs(work, CONFIG, [zero1, tp], reps=2)
    key = framework_key(2, 1, 1, 1, False, 1)
    assert set(out.framework) == {key, framework_key(1, 1, 2, 0, False, 1)}
    calls = sum(collective_counts(work, zero1.dims, 1).values()) - 1  # less the clip's
    assert out.unit_call_s["zero1"] == pytest.approx(out.framework[key] / calls)
    assert out.layers == work.layers and not work.framework  # a new Workload


def test_inside_a_process_group_it_refuses():
    dist.init_process_group("fake", rank=0, world_size=2)
    try:
        with pytest.raises(RuntimeError, match="already has a default group"):
            strategy_step_s(cap.Strategy.parse("dp", 2), CONFIG)
    finally:
        dist.destroy_process_group()
