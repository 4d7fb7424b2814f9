"""Tests for labkit/capstone: strategies as data, stages, and every strategy against one process."""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.capstone import NAMES, Strategy

TINY = dict(dim=16, n_layers=2, n_heads=2, seq_len=8, batch=8, steps=2, eval_every=1, val_batch=8)


def test_every_name_parses_and_names_itself() -> None:
    for name in NAMES:
        p = 8 if name == "dp_pp_tp" else 4
        s = Strategy.parse(name, p)
        assert s.world_size == p and s.name == name, (name, s)
    assert Strategy.parse("dp_tp", 4).label == "dp2·pp1·tp2·zero0·m1"
    assert Strategy.parse("pp", 4, microbatches=2).label == "dp1·pp4·tp1·zero0·m2"
    assert Strategy.parse("fsdp", 2) == Strategy(dp=2, zero_stage=3, fsdp=True)
    assert Strategy.parse("dp", 2, microbatches=2).microbatches == 2  # accumulation
    assert Strategy.parse("dp_pp_tp", 8).dims.label == "dp2·pp2·tp2"
    fsdp, zero3 = Strategy.parse("fsdp", 2), Strategy.parse("zero3", 2)
    assert fsdp.label == zero3.label and fsdp.key != zero3.key  # run_many keys by .key


def test_rank_layout_puts_tp_innermost() -> None:
    s = Strategy(dp=2, pp=1, tp=2)
    assert [s.coords(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1)]
    s = Strategy(dp=2, pp=2, microbatches=2)
    assert [s.coords(r) for r in range(4)] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    with pytest.raises(ValueError, match="not in 0..3"):
        s.coords(4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"dp": 0}, "dp must be an int >= 1"),
        ({"microbatches": 0}, "microbatches must be an int >= 1"),
        ({"zero_stage": 4}, "zero_stage"),
        ({"fsdp": True}, "fsdp is ZeRO-3"),
        ({"tp": 2, "zero_stage": 1}, r"ZeRO-1 with pp\(1\) and tp\(2\)"),
        ({"pp": 2, "zero_stage": 3, "fsdp": True}, r"FSDP2 with pp\(2\)"),
    ],
)
def test_bad_strategies_show_the_arithmetic(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        Strategy(**kwargs)


def test_parse_errors() -> None:
    with pytest.raises(ValueError, match="unknown strategy"):
        Strategy.parse("ring", 4)
    with pytest.raises(ValueError, match="even p >= 4"):
        Strategy.parse("dp_tp", 2)
    with pytest.raises(ValueError, match="p = 8, 12, 16"):
        Strategy.parse("dp_pp_tp", 4)


def test_from_plan_runs_the_planners_plans() -> None:
    gpt = lk.models.TinyGPT(20, 16, 2, 2, 8)
    spec = lk.planner.ModelSpec.from_module(
        gpt, n_layers=2, hidden=16, seq_len=8, batch=8, n_heads=2
    )
    plans = lk.planner.plan(spec, lk.planner.DeviceSpec(4, 1e9, 1e9), lk.Network.preset("10GbE"))
    runnable = [p for p in plans if Strategy.runs(p)]
    assert runnable and len(runnable) < len(plans)
    for p in runnable:
        s = Strategy.from_plan(p)
        assert (s.dp, s.pp, s.tp, s.microbatches) == (p.dp, p.pp, p.tp, p.microbatches)
        assert s.label == p.label or (p.dp == 1 and s.zero_stage == 0)
        assert s.key.startswith(s.label)
    bad = next(p for p in plans if p.pp > 1 and p.zero_stage in (1, 2) and p.dp > 1)
    assert not Strategy.runs(bad)  # labkit's ZeRO shards only pure data parallelism
    both = next(p for p in plans if p.pp > 1 and p.tp > 1 and p.zero_stage == 0)
    assert Strategy.runs(both)  # pp × tp composes
    fsdp_tp = next(p for p in plans if p.tp > 1 and p.pp == 1 and p.dp > 1 and p.zero_stage == 3)
    assert Strategy.from_plan(fsdp_tp).fsdp  # ZeRO-3 with tp runs as FSDP2 × DTensor TP


def test_stages_hold_embedding_blocks_and_head() -> None:
    gpt = lk.models.TinyGPT(20, 16, 4, 2, 8, seed=1)
    stages = lk.capstone.gpt_stages(gpt, 2)
    assert [len(s) for s in stages] == [3, 3]  # embedding + 2 blocks, 2 blocks + head
    x = torch.randint(0, 20, (2, 8))
    torch.testing.assert_close(stages[1](stages[0](x)), gpt(x))
    assert [len(s) for s in lk.capstone.gpt_stages(gpt, 4)] == [2, 1, 1, 2]
    with pytest.raises(ValueError, match=r"pp\(3\) must divide n_layers\(4\)"):
        lk.capstone.gpt_stages(gpt, 3)


def test_config_check_names_what_does_not_divide() -> None:
    c = lk.capstone.RunConfig(**TINY)
    c.check(Strategy(dp=2))
    with pytest.raises(ValueError, match=r"pp\(4\) does not divide n_layers\(2\)"):
        c.check(Strategy(pp=4, microbatches=2))
    with pytest.raises(ValueError, match=r"tp\(4\) must divide n_heads\(2\)"):
        c.check(Strategy(tp=4))
    with pytest.raises(ValueError, match=r"microbatches\(3\) ∤ batch\(8\)"):
        c.check(Strategy(pp=2, microbatches=3))


def _check_against_reference(results: dict, ref: dict, config) -> None:
    want = dict(ref["model"].named_parameters())
    for label, ranks in results.items():
        for r in ranks:
            assert r["losses"] == pytest.approx(ref["losses"], rel=1e-5), label
            assert r["val_losses"] == pytest.approx(ref["val_losses"], rel=1e-5), label
            assert r["val_steps"] == ref["val_steps"] == [0, 1, 2]
            assert len(r["step_s"]) == config.steps and min(r["step_s"]) > 0
        got = ranks[0]["full_state"]
        assert got.keys() == want.keys(), label
        for k in want:  # Adam moves near-zero gradients by up to lr: allow lr/10
            torch.testing.assert_close(got[k], want[k].detach(), rtol=0, atol=config.lr / 10)
        assert all(r["full_state"] is None for r in ranks[1:])


def test_strategies_on_two_ranks_equal_one_process() -> None:
    config = lk.capstone.RunConfig(**TINY)
    names = ["dp", "zero2", "zero3", "fsdp", "tp", "pp"]
    strategies = [Strategy.parse(n, 2, microbatches=2) for n in names]
    results = lk.capstone.run_many(strategies, config, timeout=180)
    ref = lk.capstone.train_reference(config)
    _check_against_reference(results, ref, config)
    n = lk.models.count_parameters(ref["model"])
    total = {s.name: [sum(r["bytes"].values()) for r in results[s.key]] for s in strategies}
    assert total["dp"][0] >= 16 * n  # params, grads, Adam's two states (+ step counters)
    assert all(max(total[k]) < 0.8 * total["dp"][0] for k in ("zero3", "fsdp", "tp", "pp"))
    assert max(total["zero3"]) < max(total["zero2"]) < total["dp"][0]


def test_two_dimensional_strategies_on_four_ranks_equal_one_process() -> None:
    config = lk.capstone.RunConfig(**TINY)
    strategies = [Strategy.parse("dp_tp", 4), Strategy.parse("dp_pp", 4, microbatches=2)]
    results = lk.capstone.run_many(strategies, config, timeout=240)
    _check_against_reference(results, lk.capstone.train_reference(config), config)


def test_run_rejects_a_config_it_cannot_split_before_launching() -> None:
    with pytest.raises(ValueError, match="cannot train this model"):
        lk.capstone.run(Strategy(tp=4), lk.capstone.RunConfig(**TINY))
    with pytest.raises(ValueError, match="one world size"):
        lk.capstone.run_many([Strategy(dp=2), Strategy(dp=4)], lk.capstone.RunConfig(**TINY))
