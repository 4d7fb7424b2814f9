"""The step-time model by hand: 1F1B played through, the workload, each strategy's terms."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from labkit.costmodel.machine import BackendCosts, MachineModel, predict_collective
from labkit.parallel.dims import ParallelDims
from labkit.parallel.pipeline import one_f_one_b
from labkit.plan_pipeline import one_f_one_b_order, pipeline_time
from labkit.plan_time import _Pricer, step_time
from labkit.plan_workload import LayerCost, Workload

# Every collective costs its per-call overhead alone (no bytes are priced: β = 0, no copy
# rates; labkit_shm's recipes, whose rounds cost nothing here, not gloo's, whose segments cost
# α each), and compute shares nothing: the terms can be added up by hand.
COST = {"all_reduce": 1e-3, "all_gather": 2e-3, "reduce_scatter": 3e-3}
OVERHEAD = {(op, p): t for op, t in COST.items() for p in (2, 4)}
NET = BackendCosts("gloo", "labkit_shm", alpha=5e-4, beta=0.0, overhead_s=OVERHEAD)
MACHINE = MachineModel(cores=8, compute_share={2: 1.0, 4: 1.0}, backends={"gloo": NET})

EMBED = LayerCost("embed", ((10, 4),), forward=(1e-3, 0.0), backward=(2e-3, 0.0), width=4)
BLOCK = LayerCost(
    "block",
    ((8,), (6, 2), (4,)),  # 3 units
    forward=(1e-3, 1e-5),
    backward=(2e-3, 2e-5),
    block=True,
    tp_colwise=4,
    tp_rowwise=2,
    tp_split=16,
    width=4,
)
HEAD = LayerCost("head", ((3,),), forward=(1e-3, 0.0), backward=(1e-3, 0.0), width=7)
WORK = Workload((EMBED, BLOCK, BLOCK, HEAD), batch=8, seq_len=10, adam=(1e-4, 1e-6))


def test_one_f_one_b_order_is_the_runtime_schedule():
    for p, m in ((1, 1), (2, 3), (4, 4), (4, 2)):
        sched = one_f_one_b(p, m)
        for s in range(p):
            got = [(a.op, a.microbatch) for a in sched[s] if a is not None]
            assert got == one_f_one_b_order(p, s, m)


def test_pipeline_time_equal_stages_is_the_bubble_formula():
    for p, m in ((1, 3), (2, 1), (3, 4), (4, 8)):
        t = pipeline_time([1.0] * p, [2.0] * p, m)
        assert math.isclose(t.step_s, (m + p - 1) * 3.0)  # (m + p − 1)(F + B)
        frac = (t.step_s - t.busy_s[0]) / t.step_s
        assert math.isclose(frac, (p - 1) / (m + p - 1))  # GPipe's bubble, Huang et al. 2019
    # two stages, hops of 0.5: m = 1: F0 [0,1], F0' [1.5,2.5], B0' [2.5,4.5], B0 [5,7];
    # m = 2: stage 0 F0 [0,1], F1 [1,2], B0 [5,7], B1 [8,10]: 2 hops on the path either way
    assert pipeline_time([1.0] * 2, [2.0] * 2, 1, hop_s=0.5).step_s == 7.0
    assert pipeline_time([1.0] * 2, [2.0] * 2, 2, hop_s=0.5).step_s == 10.0
    # deeper pipelines wait for hops in the steady state too: more than 2(p − 1) of them
    assert pipeline_time([1.0] * 3, [2.0] * 3, 4, hop_s=0.5).step_s > 6 * 3.0 + 2 * 2 * 0.5


def test_pipeline_time_unequal_stages_by_hand():
    # stage 0: F0 [0,1], F1 [1,2], B0 [7,9], B1 [13,15]; stage 1: F0 [1,3], B0 [3,7],
    # F1 [7,9], B1 [9,13]
    t = pipeline_time([1.0, 2.0], [2.0, 4.0], 2)
    assert t.step_s == 15.0 and t.busy_s == (6.0, 12.0) and t.idle_s == (9.0, 3.0)
    with pytest.raises(ValueError):
        pipeline_time([1.0], [1.0, 2.0], 2)


def test_a_hop_may_cost_more_while_other_stages_compute():
    f, b = [1.0] * 3, [2.0] * 3
    seen = []

    def hop(k):
        seen.append(k)
        return 0.5 if k >= 1 else 0.0

    free, flat = pipeline_time(f, b, 4), pipeline_time(f, b, 4, hop_s=0.5)
    assert pipeline_time(f, b, 4, hop_s=lambda k: 0.5).step_s == flat.step_s
    mixed = pipeline_time(f, b, 4, hop_s=hop)
    assert free.step_s < mixed.step_s < flat.step_s  # the fill's first hops leave idle stages
    assert set(seen) == {0, 1, 2}  # the others computing when a message leaves: 0 … p − 1
    # with copies, their ranks compute too
    seen.clear()
    pipeline_time(f, b, 4, hop_s=hop, copies=2)
    assert max(seen) == 4 and min(seen) == 0


def test_pipeline_hops_while_every_core_computes():
    costs = {**OVERHEAD, ("p2p", 4): 1e-4, ("p2p_busy", 4): 2e-3}
    net = BackendCosts("gloo", "labkit_shm", alpha=5e-4, beta=0.0, sync_s=costs)
    few = MachineModel(cores=2, compute_share={2: 1.0, 4: 1.0}, backends={"gloo": net})
    many = MachineModel(cores=8, compute_share={2: 1.0, 4: 1.0}, backends={"gloo": net})
    four = ParallelDims(1, 2, 1)
    work = Workload((EMBED, BLOCK, BLOCK, BLOCK, BLOCK, HEAD), batch=8, seq_len=10)
    on_two = step_time(work, few, "gloo", ParallelDims(1, 4, 1), microbatches=4)
    on_eight = step_time(work, many, "gloo", ParallelDims(1, 4, 1), microbatches=4)
    assert on_two.bubble_s > on_eight.bubble_s  # 3 other stages computing take both cores
    assert "2000 us while every core computes" in " ".join(on_two.reasons)
    # unmeasured: a busy hop is priced as any hop
    plain = BackendCosts("gloo", "labkit_shm", alpha=5e-4, beta=0.0, sync_s=OVERHEAD)
    m = MachineModel(cores=2, compute_share={2: 1.0}, backends={"gloo": plain})
    t = step_time(work, m, "gloo", four, microbatches=2)
    assert "hops of 500 us, 500 us while" in " ".join(t.reasons)


def test_pipeline_stages_share_one_core_only_while_both_compute():
    # one core (k ranks computing: each at 1/k speed), F = B = 1: stage 0 F0 [0,1]; F1 and
    # stage 1's F0 together [1,3]; stage 1 B0 alone [3,4]; stage 0 B0 and stage 1 F1 together
    # [4,6]; stage 1 B1 [6,7]; stage 0 B1 [7,8]: the 8 units of work on one core, no idle core
    t = pipeline_time([1.0, 1.0], [1.0, 1.0], 2, share=lambda k: float(k))
    assert t.step_s == 8.0 and t.busy_s == (4.0, 4.0)
    assert pipeline_time([1.0, 1.0], [1.0, 1.0], 2).step_s == 6.0  # a core each: (m+p-1)(F+B)
    # two pipelines side by side (dp = 2) on the same core: always at least 2 ranks busy
    assert (
        pipeline_time([1.0, 1.0], [1.0, 1.0], 2, share=lambda k: float(k), copies=2).step_s == 16.0
    )


def test_a_stage_receiving_a_message_shares_the_core_by_hand():
    # one core, F = B = 1, hops of 0.5, m = 2. Stage 0 runs F1 alone while stage 1 waits
    # for F0's message, [1, 1.5]: ... hop-free sharing gives 8.5 (traced: s0 F1 ends 2.5, s1
    # B0 [3, 4], s0 B0 [4.5, 6.5] beside s1's F1 and B1, s0 B1 [7.5, 8.5]). Counting the
    # receiver: s0 F1 at half speed while s1 receives, ends 3.0; s1 F0 ends 3.25, B0 [3.25,
    # 4.25]; s1 F1 at half speed while s0 receives [4.25, 4.75]; s0 B0 ends 6.75, s1 B1 7.5;
    # s0 B1 [8, 9]
    one_core = lambda k: float(k)  # noqa: E731
    f = b = [1.0, 1.0]
    assert pipeline_time(f, b, 2, 0.5, one_core).step_s == 8.5
    assert pipeline_time(f, b, 2, 0.5, one_core, receiving_computes=True).step_s == 9.0
    # free hops: nobody is ever receiving, the 8 units of work on one core as before
    assert pipeline_time(f, b, 2, 0.0, one_core, receiving_computes=True).step_s == 8.0
    # without sharing a receiver costs nobody anything
    assert (
        pipeline_time(f, b, 2, 0.5, receiving_computes=True).step_s
        == pipeline_time(f, b, 2, 0.5).step_s
    )


def test_more_ranks_than_cores_price_every_hop_as_measured_while_all_compute():
    costs = {**OVERHEAD, ("p2p", 4): 1e-4, ("p2p_busy", 4): 2e-3}
    net = BackendCosts("gloo", "labkit_shm", alpha=5e-4, beta=0.0, sync_s=costs)
    work = Workload((EMBED, BLOCK, BLOCK, BLOCK, BLOCK, HEAD), batch=8, seq_len=10)
    stages = work.stages(4)
    f = [sum(work.layers[i].time_s(20)[0] for i in st) for st in stages]  # b = 8/4: 20 tokens
    b = [sum(work.layers[i].time_s(20)[1] for i in st) for st in stages]
    msg = 20 * work.layers[stages[0][-1]].width * 4
    for cores, share in ((2, {2: 1.2, 4: 2.5}), (4, {2: 1.0, 4: 1.0})):
        machine = MachineModel(cores=cores, compute_share=share, backends={"gloo": net})
        t = step_time(work, machine, "gloo", ParallelDims(1, 4, 1), microbatches=4)
        busy = predict_collective(machine, "gloo", "p2p_busy", msg, 4, True)
        every_hop_busy = pipeline_time(
            f, b, 4, busy, machine.compute_share_at, receiving_computes=True
        ).step_s
        if cores == 2:  # 4 ranks on 2 cores: the sender computes on, the others take the rest
            assert math.isclose(t.compute_s + t.bubble_s, every_hop_busy)
        else:  # a core per rank: a hop is busy only while every core computes
            assert t.compute_s + t.bubble_s < every_hop_busy


def test_workload_layout():
    assert WORK.numel == 14 + 2 * 20 + 3 and WORK.n_blocks == 2
    assert WORK.stages(1) == [[0, 1, 2, 3]] and WORK.stages(2) == [[0, 1], [2, 3]]
    with pytest.raises(ValueError):
        WORK.stages(3)
    assert WORK.buckets([0, 1, 2, 3]) == [(14 + 40 + 3) * 4]  # one bucket under 25 MiB
    small = Workload(WORK.layers, 8, 10, bucket_cap_bytes=100)
    assert small.buckets([0, 1, 2, 3]) == [92.0, 80.0, 56.0]  # reverse order: head+block, ...
    assert BLOCK.local_numel(2) == 20 - 8 and BLOCK.time_s(10, tp=2) == (1e-3 + 5e-5, 2e-3 + 1e-4)
    assert EMBED.time_s(10, tp=2) == (1e-3, 2e-3)  # only blocks split their work


def _compute(tokens: int, m: int, tp: int = 1) -> float:
    return m * sum(sum(layer.time_s(tokens, tp)) for layer in WORK.layers)


def _adam(elements: float, tensors: int = 11) -> float:
    return 1e-4 * tensors + 1e-6 * elements


def test_data_parallel_by_hand():
    t = step_time(WORK, MACHINE, "gloo", ParallelDims(2, 1, 1))
    assert math.isclose(t.compute_s, _compute(40, 1))  # b = 8/2 = 4 sequences, 40 tokens
    assert t.comm["dp"] == 1e-3 and t.comm["clip"] == 1e-3  # one bucket, one scalar
    assert math.isclose(t.optimizer_s, _adam(57))
    assert math.isclose(t.step_s, t.compute_s + 2e-3 + t.optimizer_s)
    accum = step_time(WORK, MACHINE, "gloo", ParallelDims(2, 1, 1), microbatches=2)
    assert math.isclose(accum.compute_s, _compute(20, 2)) and accum.comm["dp"] == 1e-3


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_collectives_per_unit_by_hand(stage):
    t = step_time(WORK, MACHINE, "gloo", ParallelDims(2, 1, 1), zero_stage=stage, microbatches=2)
    units = 1 + 3 + 3 + 1
    gathers = {1: 1, 2: 1, 3: 0}[stage]  # after Adam (stage 3 gathers in forward/backward)
    assert math.isclose(t.comm["dp"], units * (3e-3 + gathers * 2e-3))
    assert math.isclose(t.optimizer_s, _adam(57 / 2))  # each rank updates its half
    per_mb = units * 2e-3 if stage == 3 else 0.0  # all-gather before forward and backward
    assert math.isclose(t.compute_s, _compute(20, 2) + 2 * 2 * per_mb)
    assert math.isclose(t.comm["zero3"], 2 * 2 * per_mb)


def test_tensor_parallel_by_hand():
    t = step_time(WORK, MACHINE, "gloo", ParallelDims(1, 1, 2))
    all_reduces = 2 * (4 + 2)  # per block: q, k, v, fc1 backward; proj, fc2 forward
    assert math.isclose(t.comm["tp"], all_reduces * 1e-3)
    assert math.isclose(t.compute_s, _compute(80, 1, tp=2) + all_reduces * 1e-3)
    assert math.isclose(t.optimizer_s, _adam(57 - 16))  # 2 blocks × 8 split away
    assert t.comm["dp"] == 0


def test_pipeline_by_hand():
    t = step_time(WORK, MACHINE, "gloo", ParallelDims(1, 2, 1), microbatches=2)
    tokens = 40  # b = 8/(1·2) = 4 sequences of 10
    f = [EMBED.time_s(tokens)[0] + BLOCK.time_s(tokens)[0], BLOCK.time_s(tokens)[0] + 1e-3]
    b = [EMBED.time_s(tokens)[1] + BLOCK.time_s(tokens)[1], BLOCK.time_s(tokens)[1] + 1e-3]
    hop = 5e-4  # one p2p message of 40·4 floats: α (β = 0)
    want = pipeline_time(f, b, 2, hop)
    assert math.isclose(t.compute_s + t.bubble_s, want.step_s)
    assert math.isclose(t.compute_s, max(want.busy_s))
    assert math.isclose(t.optimizer_s, _adam(14 + 20, 2 + 4))  # stage 0 has more to update
    assert math.isclose(t.step_s, want.step_s + 1e-3 + t.optimizer_s)


def test_the_strategys_own_code_by_hand():
    import dataclasses

    from labkit.plan_time import framework_time
    from labkit.plan_workload import framework_key

    timed = {framework_key(2, 1, 1, 3, True, 1): 0.05, framework_key(2, 1, 2, 0): 0.004}
    work = dataclasses.replace(WORK, framework=timed, unit_call_s={"zero1": 1e-4})
    shared = MachineModel(cores=2, compute_share={2: 1.0, 4: 1.5}, backends={"gloo": NET})
    plain = step_time(WORK, shared, "gloo", ParallelDims(2, 1, 1), zero_stage=3, fsdp=True)
    fsdp = step_time(work, shared, "gloo", ParallelDims(2, 1, 1), zero_stage=3, fsdp=True)
    assert fsdp.framework_s == 0.05 and plain.framework_s == 0.0  # timed: taken as it is
    assert math.isclose(fsdp.step_s, plain.step_s + 0.05)
    dp_tp = step_time(work, shared, "gloo", ParallelDims(2, 1, 2))  # 4 ranks share 2 cores
    assert math.isclose(dp_tp.framework_s, 0.004 * 1.5)
    # not timed: its flavour's cost per unit collective × its unit collectives (8 units, a
    # reduce-scatter and an all-gather each), on 4 ranks too; no flavour timed: nothing
    assert math.isclose(framework_time(work, ParallelDims(4, 1, 1), zero_stage=1), 16e-4)
    four = step_time(work, shared, "gloo", ParallelDims(4, 1, 1), zero_stage=1)
    assert math.isclose(four.framework_s, 16e-4 * 1.5)
    assert framework_time(work, ParallelDims(4, 1, 1), zero_stage=2) == 0.0
    assert framework_time(work, ParallelDims(1, 1, 1), zero_stage=1) == 0.0  # dp 1: no ZeRO
    assert any("own code" in r for r in four.reasons)


def test_groups_smaller_than_the_world_share_the_cores():
    shared = MachineModel(cores=2, compute_share={2: 1.0, 4: 2.0}, backends={"gloo": NET})
    alone = step_time(WORK, shared, "gloo", ParallelDims(1, 1, 2))
    inside = step_time(WORK, shared, "gloo", ParallelDims(2, 1, 2))  # tp pairs on 4 ranks
    assert math.isclose(inside.comm["tp"], 2 * 12 * 1e-3 / 2 * 2)  # half the tokens, ×2 shared
    assert math.isclose(alone.comm["tp"], 12 * 1e-3)
    with pytest.raises(ValueError):
        step_time(WORK, MACHINE, "gloo", ParallelDims(2, 1, 1), microbatches=3)


def test_workload_of_a_real_tinygpt_and_its_flop_twin():
    import labkit as lk
    from labkit.bench_workload import workload_from_model
    from labkit.capstone import gpt_stages, gpt_tp_plan
    from labkit.parallel.zero import find_units
    from labkit.plan_workload import transformer_workload

    V, h, L, T, B = 11, 8, 2, 4, 4
    gpt = lk.models.TinyGPT(V, h, L, 2, T)
    x = torch.randint(0, V, (B, T))
    work = workload_from_model(
        gpt, lambda b: x[:b], lambda b: x[:b], lk.capstone.lm_loss, batch=B, seq_len=T,
        blocks=range(1, L + 1), tp_plan=gpt_tp_plan(gpt), sizes=(1, 2), reps=1,
    )  # fmt: skip
    assert work.numel == lk.models.count_parameters(gpt)
    units = [tuple(p.numel() for p in u.params) for u in find_units(gpt, 1)]
    assert [u for layer in work.layers for u in layer.units] == units
    for pp in (1, 2):  # the workload's stages are gpt_stages'
        sizes = [sum(p.numel() for p in s.parameters()) for s in gpt_stages(gpt, pp)]
        assert [sum(work.layers[i].numel for i in st) for st in work.stages(pp)] == sizes
    block = work.layers[1]
    assert (block.tp_colwise, block.tp_rowwise, block.width) == (4, 2, h)
    twin = transformer_workload(V, h, L, T, B, flops=1e9)
    assert twin.numel == work.numel and twin.layers[1].tp_split == block.tp_split
    assert [layer.units for layer in twin.layers] == [layer.units for layer in work.layers]
    assert math.isclose(twin.layers[1].forward[1], (24 * h * h + 4 * T * h) / 1e9)


def test_buckets_overlap_backward_where_a_network_carries_them():
    from labkit.costmodel import Network, predict

    net = Network(latency_us=100.0, bandwidth_gbps=1.0, name="net")
    gpu = MachineModel.from_network(net)
    small = Workload(WORK.layers, 8, 10, bucket_cap_bytes=100)  # buckets of 92, 80, 56 bytes
    t = step_time(small, gpu, "net", ParallelDims(2, 1, 1))
    all_reduces = [predict("all_reduce", n, 2, net) for n in (92, 80, 56)]
    backward = sum(layer.time_s(40)[1] for layer in WORK.layers)  # 40 tokens per rank
    # all but the last bucket hide behind the backward (Li et al. 2020, §3.2.3)
    assert math.isclose(t.comm["dp"], max(sum(all_reduces) - backward, all_reduces[-1]))
    two_cores = MachineModel(cores=2, compute_share={2: 1.0}, backends={"gloo": NET})
    on_cpu = step_time(small, two_cores, "gloo", ParallelDims(2, 1, 1))  # no core to spare
    assert math.isclose(on_cpu.comm["dp"], 3 * 1e-3)


def test_plan_prices_every_grid_with_the_calibrated_step_time():
    from labkit.costmodel import Network
    from labkit.planner import Calibrated, DeviceSpec, ModelSpec, plan

    spec = ModelSpec(n_params=WORK.numel, n_layers=2, hidden=4, seq_len=10, batch=8, n_heads=2)
    net = Network(latency_us=100.0, bandwidth_gbps=1.0, name="net")
    plans = plan(spec, DeviceSpec(2, 1e9, 1e9), net, calibrated=Calibrated(MACHINE, WORK, "gloo"))
    feasible = [p for p in plans if p.feasible]
    assert {(p.dp, p.pp, p.tp) for p in feasible} == {(2, 1, 1), (1, 2, 1), (1, 1, 2)}
    for p in feasible:  # each plan's time is step_time's for its grid, nothing added
        dims = ParallelDims(p.dp, p.pp, p.tp)
        want = step_time(WORK, MACHINE, "gloo", dims, p.zero_stage if p.dp > 1 else 0,
                         microbatches=p.microbatches)  # fmt: skip
        assert p.step is not None and math.isclose(p.step_s, want.step_s)
        assert math.isclose(p.compute_s + p.bubble_s + p.comm_s, want.step_s)
    assert [p.step_s for p in feasible] == sorted(p.step_s for p in feasible)  # best first
    # by hand: plain DP computes 40 tokens per rank, pays one bucket and the clipping's
    # scalar (1 ms each), and Adam over all 57 parameters
    dp = next(p for p in feasible if (p.dp, p.zero_stage, p.microbatches) == (2, 0, 1))
    assert math.isclose(dp.step_s, _compute(40, 1) + 2e-3 + _adam(57))


def test_a_groups_call_inside_a_larger_world_is_priced_as_measured_there():
    # tp or dp pairs inside 4 ranks on 2 cores: scaled by the sharing unless measured so
    n, key = 1 << 17, ("all_reduce", 2)
    net = BackendCosts(
        "gloo",
        "gloo",
        alpha=1e-4,
        beta=0.0,
        overhead_s={key: 1e-4},
        wake_s={key: {8: 0.0, n: 1e-3}},
    )
    m = MachineModel(cores=2, compute_share={2: 1.0, 4: 3.0}, backends={"gloo": net})
    alone = predict_collective(m, "gloo", "all_reduce", n, 2, True)
    assert _Pricer(m, "gloo", 4)("all_reduce", n, 2) == pytest.approx(3.0 * alone)
    pairs = dataclasses.replace(net, wake_s={**net.wake_s, (*key, 4): {n: 2e-3}})
    m = dataclasses.replace(m, backends={"gloo": pairs})
    back_to_back = predict_collective(m, "gloo", "all_reduce", n, 2)
    assert _Pricer(m, "gloo", 4)("all_reduce", n, 2) == pytest.approx(back_to_back + 2e-3)
    assert _Pricer(m, "gloo", 2)("all_reduce", n, 2) == pytest.approx(alone)  # its own world


def test_calls_inside_forward_and_backward_cost_their_cpu_on_too_few_cores():
    # DP×TP on 4 ranks, 2 cores: the tp pairs' all-reduces and ZeRO-3's gathers come inside
    # forward and backward, out of step with the other pair, which computes through their
    # waits: each costs its CPU time × the ranks taking turns on a core (4 / 2); the dp and
    # clip calls after backward keep their price as measured with every group at once
    n = 40 * 4 * 4  # tokens of a micro-batch × width × 4 bytes: a tp all-reduce of dp = 2
    cpu = {("all_reduce", 2, 4): {8: 2e-4, 1 << 20: 2e-4}, ("all_gather", 2, 4): {8: 5e-4}}
    net = dataclasses.replace(NET, cpu_s=cpu)
    m = MachineModel(cores=2, compute_share={2: 1.0, 4: 2.0}, backends={"gloo": net})
    price = _Pricer(m, "gloo", 4)
    assert price("all_reduce", n, 2, inside=True) == pytest.approx(2e-4 * 2)
    assert price("all_reduce", n, 2) == pytest.approx(1e-3 * 2)  # after backward: as before
    assert price("reduce_scatter", n, 2, inside=True) == pytest.approx(3e-3 * 2)  # unmeasured
    assert price("all_reduce", n, 4, inside=True) == pytest.approx(1e-3)  # the whole world
    t = step_time(WORK, m, "gloo", ParallelDims(2, 1, 2))
    assert math.isclose(t.comm["tp"], 12 * 2e-4 * 2)
    z = step_time(WORK, m, "gloo", ParallelDims(2, 1, 2), zero_stage=3)
    units = 1 + 3 + 3 + 1
    assert math.isclose(z.comm["zero3"], 2 * units * 5e-4 * 2)
    # a core per rank: no one computes on a waiting rank's core: priced as before, not its CPU
    roomy = dataclasses.replace(m, cores=4)
    assert _Pricer(roomy, "gloo", 4)("all_reduce", n, 2, inside=True) == pytest.approx(2e-3)
