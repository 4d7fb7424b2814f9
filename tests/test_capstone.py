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
    recipe = [
        ({"precision": "fp16"}, "precision must be fp32 or bf16"),
        ({"decay": "cosine", "warmup_steps": 2}, r"warmup_steps\(2\) < steps"),
        ({"ckpt_at": 1}, r"ckpt_at\(1\) needs a ckpt_dir"),
        ({"resume": True}, "resume needs a ckpt_dir"),
        ({"max_norm": 0.0}, "max_norm must be > 0"),
    ]
    for extra, match in recipe:
        with pytest.raises(ValueError, match=match):
            lk.capstone.RunConfig(**{**TINY, **extra}).check(Strategy(dp=2))


# The course's recipe on TinyGPT: 2 micro-batches per step (accumulation, or the pipeline's),
# clipping at 0.5 (the one-process norms here are 0.75 to 1.07, so every step clips), a warmup
# to √(8/2) = 2× the base rate, then a cosine; a DCP checkpoint after step 2.
RECIPE = dict(TINY, steps=3, eval_every=2, max_norm=0.5, warmup_steps=1, decay="cosine",
              base_batch=2, ckpt_at=2)  # fmt: skip


def _jobs(names: list[str], world_size: int, ckpt_dir, extra=()) -> list:
    """Each strategy with the recipe (checkpointing), then each resumed from its checkpoint."""
    config = lk.capstone.RunConfig(**RECIPE, ckpt_dir=str(ckpt_dir))
    resume = lk.capstone.RunConfig(**RECIPE, ckpt_dir=str(ckpt_dir), resume=True)
    strategies = [
        s if isinstance(s, Strategy) else Strategy.parse(s, world_size, microbatches=2)
        for s in names
    ]
    return [(s, config) for s in strategies] + [(s, resume) for s in strategies] + list(extra)


def _check_against_reference(results: list, ref: dict, config, rel: float = 1e-5) -> None:
    """Every rank's losses, gradient norms, rates and (gathered) parameters against one process."""
    want = dict(ref["model"].named_parameters())
    assert min(ref["grad_norms"]) > config.max_norm  # the bound clipped every step
    for ranks in results:
        label = ranks[0]["chain"]
        for r in ranks:
            assert r["losses"] == pytest.approx(ref["losses"], rel=rel), label
            assert r["val_losses"] == pytest.approx(ref["val_losses"], rel=rel), label
            assert r["grad_norms"] == pytest.approx(ref["grad_norms"], rel=rel), label
            assert r["lrs"] == ref["lrs"] and r["val_steps"] == ref["val_steps"], label
            assert len(r["step_s"]) == config.steps and min(r["step_s"]) > 0
        got = ranks[0]["full_state"]
        assert got.keys() == want.keys(), label
        for k in want:  # Adam moves near-zero gradients by up to the rate: allow max lr / 10
            torch.testing.assert_close(got[k], want[k].detach(), rtol=0, atol=max(ref["lrs"]) / 10)
        assert all(r["full_state"] is None for r in ranks[1:])


def _check_resumed(runs: list, resumed: list, at: int) -> None:
    """A run resumed from the checkpoint after step ``at`` continues bit for bit."""
    for ranks, again in zip(runs, resumed, strict=True):
        full, part = ranks[0], again[0]
        assert part["first_step"] == at and part["losses"] == full["losses"][at:], full["chain"]
        assert part["lrs"] == full["lrs"][at:] and part["grad_norms"] == full["grad_norms"][at:]
        assert part["val_losses"][1:] == full["val_losses"][-len(part["val_losses"]) + 1 :]
        for k, v in full["full_state"].items():
            assert torch.equal(part["full_state"][k], v), (full["chain"], k)


def test_strategies_on_two_ranks_equal_one_process_and_resume_bit_identically(tmp_path) -> None:
    names = ["dp", "zero1", "zero2", "zero3", "fsdp", "tp", "pp"]
    bf16 = lk.capstone.RunConfig(**{**RECIPE, "ckpt_at": None, "precision": "bf16"})
    extra = [(Strategy.parse(n, 2, microbatches=2), bf16) for n in ("dp", "tp")]
    results = lk.capstone.run_jobs(_jobs(names, 2, tmp_path, extra), timeout=300)
    config, n = lk.capstone.RunConfig(**RECIPE, ckpt_dir=str(tmp_path)), len(names)
    ref = lk.capstone.train_reference(config)
    _check_against_reference(results[:n], ref, config)
    _check_resumed(results[:n], results[n : 2 * n], at=2)
    # bf16 against the same recipe in bf16 on one process: each rank's matmuls see other
    # operands (micro-batches, a shard of each layer) and bf16 keeps 8 bits of mantissa, so
    # the losses agree to ~1e-4 relative here (asserted 1e-3) and the norms to ~1e-3 (1e-2).
    ref16 = lk.capstone.train_reference(bf16)
    for ranks in results[2 * n :]:
        assert ranks[0]["losses"] == pytest.approx(ref16["losses"], rel=1e-3)
        assert ranks[0]["grad_norms"] == pytest.approx(ref16["grad_norms"], rel=1e-2)
        assert ranks[0]["losses"] == pytest.approx(ref["losses"], rel=1e-2)  # and near fp32
    total = {
        name: [sum(r["bytes"].values()) for r in ranks]
        for name, ranks in zip(names, results[:n], strict=True)
    }
    p = lk.models.count_parameters(ref["model"])
    assert total["dp"][0] >= 16 * p  # params, grads, Adam's two states (+ step counters)
    assert all(max(total[k]) < 0.8 * total["dp"][0] for k in ("zero3", "fsdp", "tp", "pp"))
    assert max(total["zero3"]) < max(total["zero2"]) < total["dp"][0]


def test_two_dimensional_strategies_on_four_ranks_equal_one_process(tmp_path) -> None:
    names = [Strategy(dp=2, tp=2, microbatches=2, ac=True), "fsdp_tp", "dp_pp"]
    results = lk.capstone.run_jobs(_jobs(names, 4, tmp_path), timeout=300)
    config = lk.capstone.RunConfig(**RECIPE, ckpt_dir=str(tmp_path))
    _check_against_reference(results[:3], lk.capstone.train_reference(config), config)
    _check_resumed(results[:3], results[3:], at=2)
    assert [c.split("(")[0] for c in results[0][0]["chain"]] == [
        "apply_tp", "apply_ac", "model = apply_ddp"]  # fmt: skip


def test_dp_pp_tp_on_eight_ranks_equals_one_process(tmp_path) -> None:
    results = lk.capstone.run_jobs(_jobs(["dp_pp_tp"], 8, tmp_path), timeout=300)
    config = lk.capstone.RunConfig(**RECIPE, ckpt_dir=str(tmp_path))
    _check_against_reference(results[:1], lk.capstone.train_reference(config), config)
    _check_resumed(results[:1], results[1:], at=2)
    assert [c.split(" = ")[-1].split("(")[0] for c in results[0][0]["chain"]] == [
        "apply_pp", "apply_tp", "apply_ddp"]  # fmt: skip


GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs")
def test_strategies_on_gpus_equal_one_process_and_resume_bit_identically(tmp_path) -> None:
    """The same strategies with a GPU per rank (NCCL): every piece on the rank's device."""
    world = 8 if GPUS >= 8 else 4 if GPUS >= 4 else 2
    names = {
        2: ["dp", "zero1", "zero2", "zero3", "fsdp", "tp", "pp"],
        4: ["dp", "zero3", "fsdp", "dp_tp", "fsdp_tp", "dp_pp"],
        8: ["fsdp", "dp_tp", "fsdp_tp", "dp_pp", "dp_pp_tp"],
    }[world]
    bf16 = lk.capstone.RunConfig(**{**RECIPE, "ckpt_at": None, "precision": "bf16"})
    extra = [(Strategy.parse(names[0], world, microbatches=2), bf16)]
    results = lk.capstone.run_jobs(_jobs(names, world, tmp_path, extra), device="cuda", timeout=600)
    config, n = lk.capstone.RunConfig(**RECIPE, ckpt_dir=str(tmp_path)), len(names)
    # CUDA's float32 kernels against the CPU reference's: other sums, same recipe
    _check_against_reference(results[:n], lk.capstone.train_reference(config), config, rel=1e-4)
    _check_resumed(results[:n], results[n : 2 * n], at=2)
    ref16 = lk.capstone.train_reference(bf16)
    assert results[-1][0]["losses"] == pytest.approx(ref16["losses"], rel=1e-2)


def test_run_rejects_a_config_it_cannot_split_before_launching() -> None:
    with pytest.raises(ValueError, match="cannot train this model"):
        lk.capstone.run(Strategy(tp=4), lk.capstone.RunConfig(**TINY))
    with pytest.raises(ValueError, match="one world size"):
        lk.capstone.run_many([Strategy(dp=2), Strategy(dp=4)], lk.capstone.RunConfig(**TINY))
