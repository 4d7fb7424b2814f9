"""The planner: hand-computed plans, enumeration, sorting, infeasibility reasons, errors."""

from __future__ import annotations

import math

import pytest
from torch import nn

import labkit as lk
from labkit.costmodel import Network
from labkit.memory import STAGES, activation_bytes_per_layer, zero_memory
from labkit.parallel.dims import ParallelDims
from labkit.parallel.pipeline import bubble_fraction_theory, peak_in_flight_theory
from labkit.planner import DeviceSpec, ModelSpec, Plan, PlanError, plan

# α = 10 µs, β = 1 ns/byte: round numbers to compute by hand.
NET = Network(latency_us=10.0, bandwidth_gbps=1.0)
SMALL = ModelSpec(n_params=1000, n_layers=4, hidden=8, seq_len=4, batch=8, n_heads=2)
FOUR = DeviceSpec(count=4, memory_bytes=1e9, flops=1e6)


def find(plans: list[Plan], label: str) -> Plan:
    (p,) = [p for p in plans if p.label == label]
    return p


def test_pure_dp_by_hand():
    p = find(plan(SMALL, FOUR, NET), "dp4·pp1·tp1·zero0·m1")
    assert p.microbatch_size == 2  # 8 / (4·1)
    # fp32 params 4 + grads 4 + Adam's two fp32 states 8 = 16 bytes × 1000 parameters
    assert p.breakdown["params"] == 4000 and p.breakdown["optimizer"] == 8000
    # Korthikanti: sbh(34 + 5as/h) = 4·2·8·(34 + 5) = 2496 bytes at 16 bits, ×2 for fp32, ×4 layers
    assert p.breakdown["activations"] == pytest.approx(2496 * 2 * 4)
    assert p.memory_bytes == pytest.approx(16000 + 19968)
    assert p.compute_s == pytest.approx(6 * 1000 * 8 * 4 / (4 * 1e6))  # 0.048 s
    assert p.bubble_s == 0
    # ring all-reduce of 4000 bytes on 4 ranks: 2·3·α + 2·3/4·n·β
    assert p.comm_s == pytest.approx(6e-5 + 1.5 * 4000e-9)
    assert p.comm == pytest.approx({"dp": 6e-5 + 6e-6, "tp": 0.0, "pp": 0.0})
    assert p.step_s == pytest.approx(0.048 + 6.6e-5)
    assert p.feasible


def test_pipeline_and_tensor_parallel_by_hand():
    p = find(plan(SMALL, FOUR, NET), "dp1·pp2·tp2·zero0·m2")
    assert p.microbatch_size == 4
    assert p.breakdown["params"] == pytest.approx(4 * 250)  # Ψ/(pp·tp) = 250
    # sbh(10 + 24/t + 5as/(ht)) = 4·4·8·(10 + 12 + 2.5) = 3136; ×2 fp32; 2 layers; 2 in flight
    assert p.breakdown["activations"] == pytest.approx(3136 * 2 * 2 * 2)
    assert p.memory_bytes == pytest.approx(16 * 250 + 25088)
    assert p.bubble_s == pytest.approx(0.048 * 1 / 2)
    msg = 4 * 4 * 4 * 8  # fp32 b·s·h = 512 bytes
    tp_s = 2 * 2 * 4 * (2 * 1e-5 + msg * 1e-9)  # m · layers · 4 ring all-reduces on 2 ranks
    pp_s = 2 * 2 * (1e-5 + msg * 1e-9)  # 2m point-to-point messages
    assert p.comm == pytest.approx({"dp": 0.0, "tp": tp_s, "pp": pp_s})
    assert p.step_s == pytest.approx(0.048 + 0.024 + tp_s + pp_s)


def test_bubble_and_in_flight_agree_with_the_pipeline_lesson():
    model = ModelSpec(n_params=10**6, n_layers=8, hidden=16, seq_len=8, batch=32, n_heads=4)
    for p in plan(model, DeviceSpec(8, 1e12, 1e9), NET):
        if not p.feasible:
            continue
        frac = p.bubble_s / (p.compute_s + p.bubble_s)
        assert frac == pytest.approx(bubble_fraction_theory(p.pp, p.microbatches))
        per_layer = activation_bytes_per_layer(8, p.microbatch_size, 16, 4, tensor_parallel=p.tp)
        in_flight = peak_in_flight_theory("1f1b", 0, p.pp, p.microbatches)
        want = 2 * per_layer * (8 // p.pp) * in_flight
        assert p.breakdown["activations"] == pytest.approx(want)


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("dp", [1, 2, 8])
def test_pure_dp_memory_is_labkit_memory(dp, mixed):
    model = ModelSpec(n_params=7_500_000, n_layers=4, hidden=64, seq_len=16, batch=64, n_heads=4)
    plans = plan(model, DeviceSpec(dp, 1e12, 1e12), NET, mixed_precision=mixed)
    for stage in STAGES:
        p = find(plans, f"dp{dp}·pp1·tp1·zero{stage}·m1")
        if mixed:
            want = zero_memory(7_500_000, dp, stage)  # ZeRO's 2 + 2 + 12 bytes
        else:
            want = zero_memory(7_500_000, dp, stage, param_bytes=4, grad_bytes=4, optimizer_bytes=8)
        got = p.breakdown
        assert (got["params"], got["grads"], got["optimizer"]) == pytest.approx(
            (want.params_bytes, want.grads_bytes, want.optimizer_bytes)
        )
        assert p.memory_bytes == pytest.approx(want.total_bytes + got["activations"])


def test_zero3_moves_one_and_a_half_times_the_bytes_of_dp():
    # ZeRO §7.2: 2Ψ for stages 0-2 and 3Ψ for stage 3 (bandwidth term only: α = 0)
    net = Network(latency_us=0.0, bandwidth_gbps=1.0)
    model = ModelSpec(n_params=10**6, n_layers=2, hidden=8, seq_len=1, batch=32)
    plans = plan(model, DeviceSpec(8, 1e12, 1e12), net)
    comm = {z: find(plans, f"dp8·pp1·tp1·zero{z}·m1").comm["dp"] for z in STAGES}
    assert comm[1] == pytest.approx(comm[0]) and comm[2] == pytest.approx(comm[0])
    assert comm[3] == pytest.approx(1.5 * comm[0])
    # with 4 micro-batches stage 2 reduce-scatters 4 times, stage 1 once
    assert (
        find(plans, "dp8·pp1·tp1·zero2·m4").comm["dp"]
        > find(plans, "dp8·pp1·tp1·zero1·m4").comm["dp"]
    )


def test_every_factorization_stage_and_microbatch_count_is_listed():
    plans = plan(SMALL, FOUR, NET, zero_stages=(0, 2))
    triples = {(p.dp, p.pp, p.tp) for p in plans}
    want = {(d, p, t) for d in (1, 2, 4) for p in (1, 2, 4) for t in (1, 2, 4) if d * p * t == 4}
    assert triples == want
    assert {p.zero_stage for p in plans} == {0, 2}
    assert {p.microbatches for p in plans if p.dp == 1} == {1, 2, 4, 8}  # divisors of 8
    assert {p.microbatches for p in plans if p.dp == 4} == {1, 2}
    assert len({p.label for p in plans}) == len(plans)
    capped = plan(SMALL, FOUR, NET, max_microbatches=2)
    assert max(p.microbatches for p in capped) == 2


def test_sorted_feasible_first_by_step_time():
    tight = DeviceSpec(4, 2.4e4, 1e6)  # fits only plans that shard states or activations
    plans = plan(SMALL, tight, NET)
    flags = [p.feasible for p in plans]
    assert True in flags and False in flags
    assert flags == sorted(flags, reverse=True)  # all feasible ones come first
    ok = [p.step_s for p in plans if p.feasible]
    assert ok == sorted(ok)
    for p in plans:
        if math.isnan(p.step_s):  # tp=4 does not divide the 2 heads
            assert not p.feasible and p.tp == 4
            continue
        assert p.feasible == (p.memory_bytes <= tight.memory_bytes)
        assert math.isclose(p.step_s, p.compute_s + p.bubble_s + p.comm_s)


def test_over_budget_says_by_how_much():
    plans = plan(SMALL, DeviceSpec(4, 1e3, 1e6), NET)
    assert not any(p.feasible for p in plans)
    p = find(plans, "dp4·pp1·tp1·zero0·m1")
    over = (p.memory_bytes - 1e3) / 1e9
    assert f"memory over budget by {over:.4g} GB" in p.reasons[-1]


def test_divisibility_rules_make_plans_infeasible_with_the_reason():
    model = ModelSpec(n_params=1000, n_layers=3, hidden=8, seq_len=4, batch=6, n_heads=3)
    plans = plan(model, FOUR, NET)
    text = {p.label: " ".join(p.reasons) for p in plans}
    assert "tp=2 does not divide n_heads=3" in text["dp2·pp1·tp2·zero0·m1"]
    assert "pp=2 does not divide n_layers=3" in text["dp2·pp2·tp1·zero0·m1"]
    assert "batch=6 is not divisible by dp·m = 4·1 = 4" in text["dp4·pp1·tp1·zero0·m1"]
    assert "tp=4 does not divide n_heads=3" in text["dp1·pp1·tp4·zero0·m1"]
    broken = [p for p in plans if math.isnan(p.step_s)]
    assert broken and all(not p.feasible for p in broken)
    assert plans[-len(broken) :] == broken  # listed last
    assert not any(math.isnan(p.step_s) for p in plans if p.feasible)


def test_tensor_parallel_inside_a_node_uses_the_fast_network():
    nvlink, ib = Network.preset("NVLink"), Network.preset("100Gb-IB")
    model = ModelSpec(n_params=10**8, n_layers=8, hidden=1024, seq_len=512, batch=16, n_heads=16)
    devs = DeviceSpec(16, 80e9, 1e14, per_node=8)
    two_level = plan(model, devs, ib, intra_node=nvlink)
    slow = plan(model, devs, ib)
    fast = plan(model, devs, nvlink)
    in_node = find(two_level, "dp2·pp1·tp8·zero0·m1")  # tp inside a node, dp across nodes
    assert in_node.comm["tp"] == pytest.approx(find(fast, in_node.label).comm["tp"])
    assert in_node.comm["dp"] == pytest.approx(find(slow, in_node.label).comm["dp"])
    across = find(two_level, "dp1·pp1·tp16·zero0·m1")  # tp group spans two nodes
    assert across.comm["tp"] == pytest.approx(find(slow, across.label).comm["tp"])


def test_more_devices_memory_and_flops_help():
    model = ModelSpec(n_params=10**6, n_layers=4, hidden=8, seq_len=4, batch=16, n_heads=2)
    best4 = plan(model, DeviceSpec(4, 1e12, 1e9), NET)[0]
    fast4 = plan(model, DeviceSpec(4, 1e12, 2e9), NET)[0]
    assert fast4.compute_s == pytest.approx(best4.compute_s / 2)


def test_from_module_counts_parameters():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    spec = ModelSpec.from_module(net, n_layers=2, hidden=8, seq_len=1, batch=4)
    assert spec.n_params == 4 * 8 + 8 + 8 * 2 + 2
    assert spec.bytes_per_param == 4 and spec.name == "Sequential"
    with pytest.raises(PlanError, match="no parameters"):
        ModelSpec.from_module(nn.ReLU(), n_layers=1, hidden=1, seq_len=1, batch=1)


def test_label_and_error_cases():
    p = find(plan(SMALL, FOUR, NET), "dp2·pp1·tp2·zero1·m1")
    assert (p.dp, p.pp, p.tp, p.zero_stage, p.microbatches) == (2, 1, 2, 1, 1)
    assert issubclass(PlanError, ValueError)
    with pytest.raises(PlanError, match="count"):
        DeviceSpec(0, 1e9, 1e9)
    with pytest.raises(PlanError, match="memory_bytes"):
        DeviceSpec(4, -1, 1e9)
    with pytest.raises(PlanError, match="n_params"):
        ModelSpec(n_params=0, n_layers=1, hidden=1, seq_len=1, batch=1)
    with pytest.raises(PlanError, match="batch"):
        ModelSpec(n_params=10, n_layers=1, hidden=1, seq_len=1, batch=2.5)
    with pytest.raises(PlanError, match="zero_stages"):
        plan(SMALL, FOUR, NET, zero_stages=())
    with pytest.raises(PlanError, match="zero_stages"):
        plan(SMALL, FOUR, NET, zero_stages=(4,))
    with pytest.raises(PlanError, match="max_microbatches"):
        plan(SMALL, FOUR, NET, max_microbatches=0)
    with pytest.raises(PlanError, match="Network"):
        plan(SMALL, FOUR, "NVLink")
    with pytest.raises(PlanError, match="ModelSpec"):
        plan({"n_params": 1}, FOUR, NET)
    with pytest.raises(PlanError, match="tp_all_reduces_per_layer"):
        plan(SMALL, FOUR, NET, tp_all_reduces_per_layer=0)
    mlp = find(plan(SMALL, FOUR, NET, tp_all_reduces_per_layer=2), "dp1·pp2·tp2·zero0·m2")
    gpt = find(plan(SMALL, FOUR, NET), "dp1·pp2·tp2·zero0·m2")
    assert mlp.comm["tp"] == pytest.approx(gpt.comm["tp"] / 2)


def test_lazy_attribute():
    assert lk.planner.plan is plan


# --- the three parts of one plan, each on its own ---------------------------------------------


def test_memory_alone_by_hand():
    from labkit.plan_estimates import memory_estimate

    mem = memory_estimate(SMALL, ParallelDims(dp=1, pp=2, tp=2), stage=0, m=2, mixed=False)
    assert mem.microbatch_size == 4 and mem.params_per_device == 250  # Ψ/(pp·tp)
    assert mem.breakdown == pytest.approx(
        {"params": 1000, "grads": 1000, "optimizer": 2000, "activations": 3136 * 2 * 2 * 2}
    )
    assert mem.total == pytest.approx(4000 + 25088)
    assert mem.reasons[0].startswith("b = B/(dp·m) = 8/(1·2) = 4 sequences")
    # mixed precision: 2 + 2 + 12 bytes per parameter, 16-bit activations; ZeRO-3 over dp=4
    mixed = memory_estimate(SMALL, ParallelDims(dp=4), stage=3, m=1, mixed=True)
    assert mixed.breakdown["params"] + mixed.breakdown["grads"] == pytest.approx(4 * 1000 / 4)
    assert mixed.breakdown["optimizer"] == pytest.approx(12 * 1000 / 4)
    assert mixed.breakdown["activations"] == pytest.approx(2496 * 4)


def test_time_alone_by_hand():
    from labkit.plan_estimates import time_estimate

    dims = ParallelDims(dp=1, pp=2, tp=2)
    t = time_estimate(SMALL, FOUR, dict.fromkeys(("dp", "pp", "tp"), NET), dims, 0, 2, False, 4)
    msg = 4 * 4 * 4 * 8
    assert t.compute == pytest.approx(0.048) and t.bubble == pytest.approx(0.024)
    assert t.comm["dp"] == 0.0
    assert t.comm["tp"] == pytest.approx(2 * 2 * 4 * (2 * 1e-5 + msg * 1e-9))
    assert t.comm["pp"] == pytest.approx(2 * 2 * (1e-5 + msg * 1e-9))
    assert t.step == pytest.approx(0.072 + t.comm["tp"] + t.comm["pp"])
    assert len(t.reasons) == 6 and t.reasons[1].startswith("bubble (pp−1)/m · compute = 1/2")
    # a faster tp network only changes the tp seconds
    fast = {"dp": NET, "pp": NET, "tp": Network(latency_us=1.0, bandwidth_gbps=10.0)}
    t2 = time_estimate(SMALL, FOUR, fast, dims, 0, 2, False, 4)
    assert t2.comm["tp"] < t.comm["tp"] and t2.comm["pp"] == t.comm["pp"]


def test_cannot_run_alone_lists_every_broken_rule_and_memory():
    from labkit.plan_estimates import cannot_run

    ok = ParallelDims(dp=2, pp=2)
    assert cannot_run(SMALL, FOUR, ok, m=2) == []
    assert cannot_run(SMALL, FOUR, ok, m=2, memory_bytes=FOUR.memory_bytes) == []  # exactly fits
    over = cannot_run(SMALL, FOUR, ok, m=2, memory_bytes=FOUR.memory_bytes + 0.5e9)
    assert over == ["does not fit: memory over budget by 0.5 GB (1.5 GB > 1 GB)"]
    bad = cannot_run(SMALL, DeviceSpec(24, 1e9, 1e6), ParallelDims(dp=1, pp=8, tp=3), m=3)
    assert bad == [
        "pp=8 does not divide n_layers=4",
        "tp=3 does not divide hidden=8",
        "tp=3 does not divide n_heads=2",
        "batch=8 is not divisible by dp·m = 1·3 = 3",
    ]


def test_networks_follow_the_rank_grid():
    from labkit.plan_estimates import axis_networks

    fast, slow = Network.preset("NVLink"), Network.preset("100Gb-IB")
    devs = DeviceSpec(24, 80e9, 1e14, per_node=4)
    nets = axis_networks(ParallelDims(dp=8, tp=3), devs, slow, fast)
    # tp groups [0,1,2], [3,4,5], ...: the second straddles nodes 0 and 1, so tp is slow
    assert nets == {"dp": slow, "pp": fast, "tp": slow}
    nets = axis_networks(ParallelDims(dp=6, tp=4), devs, slow, fast)
    assert nets == {"dp": slow, "pp": fast, "tp": fast}
    assert axis_networks(ParallelDims(dp=6, tp=4), devs, slow, None) == dict.fromkeys(
        ("dp", "pp", "tp"), slow
    )


# --- activation recomputation (notebook 14) --------------------------------------------------

MODES = ("none", "selective", "full")
# One device, one sequence of s = 4 tokens: 16Ψ = 16,000 bytes of fp32 model states, and per
# layer sbh(34 + 5as/h) = 32·39 = 1248 bytes at 16 bits, 2496 in fp32 (selective: 32·34 → 2176,
# full: 2·32 → 128).
ONE_SEQ = ModelSpec(n_params=1000, n_layers=4, hidden=8, seq_len=4, batch=1, n_heads=2)


def test_recompute_memory_and_time_by_hand():
    one = DeviceSpec(count=1, memory_bytes=1e9, flops=1e6)
    plans = {p.recompute: p for p in plan(ONE_SEQ, one, NET, zero_stages=(0,), recompute=MODES)}
    assert set(plans) == set(MODES)
    acts = {r: p.breakdown["activations"] for r, p in plans.items()}
    assert acts["none"] == pytest.approx(4 * 2496)
    # kept by 4 layers, plus what one layer rebuilds in its backward (none's bytes − kept)
    assert acts["selective"] == pytest.approx(4 * 2176 + (2496 - 2176))
    assert acts["full"] == pytest.approx(4 * 128 + (2496 - 128))
    assert {r: p.memory_bytes for r, p in plans.items()} == pytest.approx(
        {r: 16000 + a for r, a in acts.items()}
    )
    compute = 6 * 1000 * 1 * 4 / 1e6  # 6Ψ·B·s / FLOP/s = 0.024 s
    assert all(p.compute_s == pytest.approx(compute) for p in plans.values())
    assert plans["none"].recompute_s == 0
    assert plans["full"].recompute_s == pytest.approx(compute / 3)  # one more forward: 2Ψ·B·s
    assert plans["selective"].recompute_s == pytest.approx(4 * 1 * 4 * 4 * 8 * 4 / 1e6)  # 4Bs²hL
    for p in plans.values():
        assert p.step_s == pytest.approx(p.compute_s + p.recompute_s + p.comm_s + p.bubble_s)
    assert plans["full"].label == "dp1·pp1·tp1·zero0·m1·ac-full"
    assert plans["selective"].label == "dp1·pp1·tp1·zero0·m1·ac-selective"
    assert plans["none"].label == "dp1·pp1·tp1·zero0·m1"
    assert any(r.startswith("recompute (full): 2·Ψ·B·s") for r in plans["full"].reasons)
    assert any("one layer rebuilds: selective" in r for r in plans["selective"].reasons)
    assert not any("recompute" in r for r in plans["none"].reasons)


@pytest.mark.parametrize(
    ("memory_bytes", "chosen"),
    [(26_000, "none"), (25_500, "selective"), (20_000, "full")],  # needs 25,984 / 25,024 / 18,880
)
def test_recompute_is_chosen_only_when_memory_needs_it(memory_bytes, chosen):
    devices = DeviceSpec(count=1, memory_bytes=memory_bytes, flops=1e6)
    best = plan(ONE_SEQ, devices, NET, zero_stages=(0,), recompute=MODES)[0]
    assert best.feasible and best.recompute == chosen
    without = plan(ONE_SEQ, devices, NET, zero_stages=(0,))
    assert without[0].feasible == (chosen == "none")  # without the option nothing else fits


def test_recompute_lengthens_the_bubble_with_the_stages():
    p = find(plan(SMALL, FOUR, NET, recompute=("full",)), "dp1·pp2·tp2·zero0·m2·ac-full")
    assert p.compute_s == pytest.approx(0.048) and p.recompute_s == pytest.approx(0.016)
    assert p.bubble_s == pytest.approx((0.048 + 0.016) * 1 / 2)
    # b = 4, t = 2: kept 2sbh = 256 bytes at 16 bits (the input is not split without sequence
    # parallelism), 512 in fp32, × 2 layers × 2 micro-batches in flight; one layer rebuilds
    # sbh(10 + 24/2 + 5as/(ht)) = 128·24.5 = 3136 → 6272 fp32, less the 512 it keeps
    assert p.breakdown["activations"] == pytest.approx(512 * 2 * 2 + (6272 - 512))


def test_default_plans_are_the_plans_without_recompute():
    default = plan(SMALL, FOUR, NET)
    offered = plan(SMALL, FOUR, NET, recompute=MODES)
    assert len(offered) == 3 * len(default) and {p.recompute for p in default} == {"none"}
    none = [p for p in offered if p.recompute == "none"]
    assert [p.label for p in none] == [p.label for p in default]
    assert [p.step_s for p in none] == pytest.approx([p.step_s for p in default], nan_ok=True)
    for p in offered:  # recompute never saves time, and never costs memory
        if p.feasible and p.recompute != "none":
            base = find(offered, p.label.rsplit("·ac-", 1)[0])
            assert p.step_s > base.step_s and p.memory_bytes <= base.memory_bytes
            # equal only when a device holds one layer of one micro-batch: kept + rebuilt
            one = SMALL.n_layers // p.pp * min(p.pp, p.microbatches) == 1
            assert (p.memory_bytes == base.memory_bytes) == one


@pytest.mark.parametrize("bad", [(), "full", ("none", "some")])
def test_recompute_modes_are_checked(bad):
    with pytest.raises(PlanError, match="recompute must be a non-empty subset"):
        plan(SMALL, FOUR, NET, recompute=bad)


def test_recompute_terms_alone():
    from labkit.plan_recompute import recompute_activation_bytes, recompute_flops

    assert recompute_flops(ONE_SEQ, "none") == 0
    assert recompute_flops(ONE_SEQ, "full") == 2 * 1000 * 4
    assert recompute_flops(ONE_SEQ, "selective") == 4 * 4 * 4 * 8 * 4
    for mode, kept in (("none", 1248), ("selective", 1088), ("full", 64)):
        got = recompute_activation_bytes(ONE_SEQ, 1, 1, mode, 2)
        assert got == pytest.approx((kept, 1248 - kept))
        assert got[0] == activation_bytes_per_layer(4, 1, 8, 2, recompute=mode)
    with pytest.raises(ValueError, match="recompute must be one of"):
        recompute_flops(ONE_SEQ, "half")
