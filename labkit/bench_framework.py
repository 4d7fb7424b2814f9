"""A strategy's own code, timed on one process with every collective removed.

Introduced in notebooks/21_capstone.ipynb.

ZeRO packs every unit's gradients into one buffer and unpacks the gathered parameters; FSDP2
runs hooks around every unit and copies into and out of its flat buffers; DTensor sends every
operator through Python. None of it is a layer or Adam, and a step-time model that prices
only those misses FSDP2 on TinyGPT by 4x on one core. Here a strategy's training step (the
capstone's ``train_step``, rank 0's share) runs on one process inside torch's fake process
group (``init_process_group("fake")``: every collective returns at once and moves nothing;
``torch.testing._internal.distributed.fake_pg``: "run a single rank ... without needing
multiple processes"), at the strategy's world size, so the shards, units and hooks are the
real ones. What the step takes beyond the model's price of the same step without
communication (layers, Adam, the rest of a single-process step), less what plain data
parallelism's step on as many ranks takes beyond its own price (that part of the gap is the
timing's, not the strategy's: plain DP's code is priced already), is the strategy's own code:
``Workload.framework``. Per sharded flavour, those seconds per unit collective
(``Workload.unit_call_s``) price the strategies that were not timed.

The collectives moved nothing, so the numbers the step computes are garbage (denormals are
flushed to zero while it runs, so they cannot slow it); only its time is kept.

    work = lk.bench.framework_costs(work, config, strategies)
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import warnings
from collections.abc import Iterable

import torch
import torch.distributed as dist

from labkit.costmodel.machine import NETWORK_KIND, BackendCosts, MachineModel
from labkit.plan_time import collective_counts, step_time
from labkit.plan_workload import Workload, framework_key

__all__ = ["framework_costs", "model_without_comm_s", "strategy_step_s"]

FREE = MachineModel(
    1 << 10, backends={"free": BackendCosts("free", NETWORK_KIND, 0.0, 0.0)}, name="free"
)  # collectives cost nothing, no core is shared


def strategy_step_s(strategy, config, reps: int = 5, warmup: int = 2) -> float:
    """The fastest of ``reps`` capstone steps of ``strategy`` on rank 0, on one process and one
    thread, inside torch's fake process group of ``strategy.world_size`` ranks.

    Args:
        strategy: a ``lk.capstone.Strategy``.
        config: the run's ``lk.capstone.RunConfig``.
        reps: timed steps; warmup: steps before them (FSDP2 initialises lazily).

    Returns:
        Seconds.

    Raises:
        RuntimeError: this process already has a default process group (call it from the
            notebook's kernel or a script, not inside a rank).
    """
    from labkit.capstone.config import global_batch
    from labkit.capstone.train import build_rank, train_step
    from labkit.data import char_corpus
    from labkit.mesh import dp_shard

    if dist.is_initialized():
        raise RuntimeError(
            "strategy_step_s starts torch's fake process group, but this process already has a "
            "default group: call it from the kernel or a script, not inside a launched rank"
        )
    s, corpus, cpu = strategy, char_corpus(), torch.device("cpu")
    threads = torch.get_num_threads()
    dist.init_process_group("fake", rank=0, world_size=s.world_size)
    try:
        torch.set_num_threads(1)
        torch.set_flush_denormal(True)
        with warnings.catch_warnings():
            for category in (DeprecationWarning, FutureWarning, UserWarning):
                warnings.filterwarnings("ignore", category=category, module=r"torch(\.|$)")
            mesh, parts, opt, schedule, context = build_rank(s, config, cpu, corpus.vocab_size)
            x, y = (dp_shard(t, s.dims, mesh) for t in global_batch(corpus, config, 0))
            m = s.microbatches if s.pp == 1 else 1
            times = []
            for _ in range(warmup + reps):
                t0 = time.perf_counter()
                train_step(parts, opt, schedule, x, y, config, m, context)
                times.append(time.perf_counter() - t0)
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(threads)
        dist.destroy_process_group()
    return min(times[warmup:])


def model_without_comm_s(work: Workload, dims, zero_stage: int, fsdp: bool, m: int) -> float:
    """``step_time``'s busiest rank without communication, sharing or the bubble: its layers,
    Adam and the rest of a single-process step (the fake step's counterpart)."""
    st = step_time(work, FREE, "free", dims, zero_stage, fsdp, m)
    return st.compute_s + st.optimizer_s + st.overhead_s


def framework_costs(work: Workload, config, strategies: Iterable, reps: int = 5) -> Workload:
    """``work`` with each strategy's own code timed (``Workload.framework``) and, per sharded
    flavour, its cost per unit collective (``Workload.unit_call_s``).

    Args:
        work: the model's ``Workload`` (``capstone_workload``), without communication.
        config: the run's ``lk.capstone.RunConfig``.
        strategies: ``lk.capstone.Strategy`` objects (each timed once, a second or less; plain
            data parallelism once per world size besides).
        reps: timed steps per strategy.

    Returns:
        A new ``Workload``.
    """
    from labkit.capstone.strategy import Strategy

    framework, per_call, base = dict(work.framework), {}, {}
    for s in strategies:
        args = (s.dims, s.zero_stage, s.fsdp, s.microbatches)
        if s.world_size not in base:  # plain data parallelism on as many ranks: the baseline
            dp = Strategy(dp=s.world_size)
            priced = model_without_comm_s(work, dp.dims, 0, False, 1)
            base[s.world_size] = strategy_step_s(dp, config, reps) - priced
        priced = model_without_comm_s(work, *args)
        extra = max(0.0, strategy_step_s(s, config, reps) - priced - base[s.world_size])
        framework[framework_key(s.dp, s.pp, s.tp, *args[1:])] = extra
        if s.zero_stage and s.dp > 1 and s.pp == s.tp == 1:
            counts = collective_counts(work, s.dims, s.zero_stage, s.microbatches)
            calls = counts["all_gather"] + counts["reduce_scatter"]
            flavour = "fsdp" if s.fsdp else f"zero{s.zero_stage}"
            per_call.setdefault(flavour, []).append(extra / calls)
    unit = dict(work.unit_call_s) | {k: statistics.fmean(v) for k, v in per_call.items()}
    return dataclasses.replace(work, framework=framework, unit_call_s=unit)
