"""Tests for labkit/parallel/pipeline/{zero_bubble,split_backward,measure}.py and the W action in
schedules/validate/metrics/runtime: ZB-H1 as data (its bubble and memory in closed form), the
validator's new rule, B/W with autograd, the runtime and torch's zero-bubble schedules equal to
one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import labkit as lk
from labkit.parallel import pipeline as pp
from labkit.parallel.pipeline import Action, ScheduleError, validate

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32: micro-batch sums reorder the additions
PM = [(p, m) for p in range(1, 7) for m in range(1, 3 * p + 1)]


# ------------------------------------------------------------------------- ZB-H1 as data


@pytest.mark.parametrize(("p", "m"), PM)
def test_zb_h1_is_valid_with_the_closed_form_bubble_and_1f1b_memory(p, m) -> None:
    s = pp.zb_h1(p, m)
    where = validate(s, p, m)
    assert len(where) == 3 * p * m and pp.splits_backward(s)
    assert all(len(row) == pp.zb_h1_slots(p, m) == 2 * m + p - 1 + max(m, p) for row in s)
    assert pp.bubble_fraction(s) == pytest.approx(pp.zb_h1_bubble_fraction(p, m), abs=1e-12)
    if m >= p:
        assert pp.bubble_fraction(s) == pytest.approx((p - 1) / (3 * m + p - 1), abs=1e-12)
        # idle slots per rank: p − 1, a third of 1F1B's 3(p − 1) when its backward is B + W
        idle = [sum(a is None for a in row) for row in s]
        assert idle == [p - 1] * p
    # memory: in flight from F to W, min(p, m) on every stage = 1F1B's peak (its first stage)
    peak = pp.peak_in_flight(s)
    assert peak == {r: pp.peak_in_flight_theory("zb_h1", r, p, m) for r in range(p)}
    assert max(peak.values()) == max(pp.peak_in_flight(pp.one_f_one_b(p, m)).values())
    assert pp.messages_in_order(s, p)  # NCCL-safe: each pair's messages in send order


def test_zb_h1_keeps_1f1b_order_of_forwards_and_backwards() -> None:
    for p, m in [(2, 4), (4, 8), (3, 2)]:
        zb, ref = pp.zb_h1(p, m), pp.one_f_one_b(p, m)
        for r in range(p):
            fb = [a for a in zb[r] if a is not None and a.op != "W"]
            assert fb == [a for a in ref[r] if a is not None]
            ws = [a.microbatch for a in zb[r] if a is not None and a.op == "W"]
            assert ws == list(range(m))
            # rank r runs its first W only after min(r + 1, m) backwards
            ops = "".join(a.op for a in zb[r] if a is not None)
            assert ops[: ops.index("W")].count("B") == min(r + 1, m)


def test_zb_h1_grid_for_two_ranks() -> None:
    assert pp.format_schedule(pp.zb_h1(2, 2)) == (
        "rank 0 | 0F0 0F1 .   0B0 0W0 0B1 0W1\nrank 1 | .   1F0 1B0 1F1 1B1 1W0 1W1"
    )


def test_existing_schedules_are_unchanged_and_not_split() -> None:
    for s in (pp.gpipe(3, 4), pp.one_f_one_b(3, 4), pp.interleaved_one_f_one_b(2, 4, 2)):
        assert not pp.splits_backward(s)
        assert not any(a is not None and a.op == "W" for row in s for a in row)
    assert pp.peak_in_flight(pp.gpipe(3, 4)) == {0: 4, 1: 4, 2: 4}  # B still ends a micro-batch


def _copy(s):
    return [list(row) for row in s]


def _where(s, action):
    return next((r, t) for r, row in enumerate(s) for t, a in enumerate(row) if a == action)


def test_validator_rejects_broken_zero_bubble_variants() -> None:
    s = pp.zb_h1(2, 2)
    validate(s, 2, 2)
    # W before its B on the same rank
    bad = _copy(s)
    r, tb = _where(bad, Action(0, "B", 0))
    _, tw = _where(bad, Action(0, "W", 0))
    bad[r][tb], bad[r][tw] = bad[r][tw], bad[r][tb]
    with pytest.raises(ScheduleError, match=r"weight-after-backward.*0W0 needs .*0B0") as err:
        validate(bad, 2, 2)
    assert (err.value.rank, err.value.slot) == (0, tb)
    # W in the same slot as its B (on another rank would be placement): two actions at once
    bad = _copy(s)
    bad[0][tb], bad[0][tw] = (Action(0, "B", 0), Action(0, "W", 0)), None
    with pytest.raises(ScheduleError, match="one-per-slot"):
        validate(bad, 2, 2)
    # a W dropped: once a schedule splits backward, every B needs its W
    bad = _copy(s)
    bad[1][_where(bad, Action(1, "W", 1))[1]] = None
    with pytest.raises(ScheduleError, match=r"exactly-once.*1W1 is missing"):
        validate(bad, 2, 2)
    # a W twice
    bad = _copy(s)
    bad[0][2] = Action(0, "W", 1)
    with pytest.raises(ScheduleError, match=r"exactly-once.*0W1 appears twice"):
        validate(bad, 2, 2)
    # a W on the rank that does not hold its stage
    bad = _copy(s)
    bad[1][_where(bad, Action(1, "W", 1))[1]] = None
    bad[0].append(Action(1, "W", 1))  # rank 0 holds stage 0 only
    bad[1].append(None)
    with pytest.raises(ScheduleError, match="placement"):
        validate(bad, 2, 2)
    # an unknown op is still unknown
    bad = _copy(s)
    bad[0][2] = Action(0, "X", 0)  # type: ignore[arg-type]
    with pytest.raises(ScheduleError, match="not F, B or W"):
        validate(bad, 2, 2)


def test_place_waits_for_the_backward_before_its_weight_gradient() -> None:
    orders = [[Action(0, "F", 0), Action(0, "W", 0), Action(0, "B", 0)]]
    with pytest.raises(ValueError, match="deadlock"):
        pp.place(orders, 1)
    s = pp.place([[Action(0, "F", 0), Action(0, "B", 0), Action(0, "W", 0)]], 1)
    assert [str(a) for a in s[0]] == ["0F0", "0B0", "0W0"]


def test_actions_from_torch_reads_compute_actions_only() -> None:
    class A:  # torch's _Action, read by attribute
        def __init__(self, stage, ctype, mb):
            self.stage_index, self.computation_type, self.microbatch_index = stage, ctype, mb

    order = {1: [None, A(1, "F", 0), A(1, "I", 0), A(1, "W", 0)], 0: [A(0, "F", 0), A(0, "B", 0)]}
    assert pp.actions_from_torch(order) == [
        [Action(0, "F", 0), Action(0, "B", 0)],
        [Action(1, "F", 0), Action(1, "B", 0), Action(1, "W", 0)],
    ]


# ----------------------------------------------------------------------- B and W with autograd


class _Tied(nn.Module):
    """One Linear used twice, its bias a third time: a group with several intermediates."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.norm = nn.Linear(8, 8), nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(torch.relu(self.lin(self.norm(x)))) + self.lin.bias


def _stage(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "tied":
        return _Tied()
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8), nn.GELU(), nn.Linear(8, 8))


@pytest.mark.parametrize("kind", ["mlp", "tied"])
def test_b_then_w_equals_the_whole_backward(kind) -> None:
    stage = _stage(kind)
    x, dy = torch.randn(4, 8), torch.randn(4, 8)
    x_ref = x.clone().requires_grad_()
    stage(x_ref).backward(dy)
    ref = {n: q.grad.clone() for n, q in stage.named_parameters()}
    stage.zero_grad(set_to_none=True)
    x_in = x.clone().requires_grad_()
    y = stage(x_in)
    dx, pending = pp.backward_input(y, dy, x_in, stage.parameters())
    assert all(q.grad is None for q in stage.parameters())  # B touched no weight gradient
    torch.testing.assert_close(dx, x_ref.grad, rtol=0, atol=0)
    pp.backward_weight(pending)
    for n, q in stage.named_parameters():
        torch.testing.assert_close(q.grad, ref[n], rtol=1e-6, atol=1e-7, msg=n)
    assert not pending.groups  # W released what B kept


def test_b_and_w_each_do_one_forward_of_matmuls_and_w_holds_one_gradient_per_linear() -> None:
    stage, b = _stage("mlp"), 4
    x = torch.randn(b, 8, requires_grad=True)
    with FlopCounterMode(display=False) as fwd:
        y = stage(x)
    with FlopCounterMode(display=False) as back_in:
        _, pending = pp.backward_input(y, torch.randn(b, 8), x, stage.parameters())
    # the captured gradients: one [b, out_features] float32 tensor per Linear
    assert pending.held_bytes == 4 * b * (16 + 8 + 8)
    with FlopCounterMode(display=False) as back_w:
        pp.backward_weight(pending)
    macs = 8 * 16 + 16 * 8 + 8 * 8
    assert fwd.get_total_flops() == back_in.get_total_flops() == back_w.get_total_flops()
    assert back_w.get_total_flops() == 2 * b * macs  # dW = dyᵀ x per layer, nothing else


def test_backward_input_needs_an_input_that_requires_grad() -> None:
    stage = _stage("mlp")
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="requires_grad"):
        pp.backward_input(stage(x), torch.ones(2, 8), x, stage.parameters())


# ---------------------------------------------------------- runtime and torch, on real ranks

LABKIT_CASES = {2: [4, 1, 6], 4: [8, 4]}  # ZB-H1 micro-batch counts per world size (m < p too)
TORCH_CASES = {2: [("zb1p", 4, 1), ("zb1p", 4, 2), ("zbv", 4, 2)], 4: [("zbv", 8, 2)]}


def _model() -> nn.Sequential:
    return lk.models.MLP(in_features=12, hidden=(16,) * 7, out_features=5, seed=3).net


def _batch(n: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 12, generator=g), torch.randint(0, 5, (n,), generator=g)


def _grads(model: nn.Module, stages) -> dict[str, torch.Tensor]:
    mine = {id(q) for s in stages for q in s.parameters()}
    return {n: q.grad.clone() for n, q in model.named_parameters() if id(q) in mine}


def _labkit_case(rank: int, p: int, m: int) -> dict:
    from labkit.backends import recording

    model, (x, y) = _model(), _batch()
    parts = pp.split_sequential(model, p)
    xs, ys = list(x.chunk(m)), list(y.chunk(m))
    recording.clear()
    res = pp.run_schedule(
        pp.zb_h1(p, m), {rank: parts[rank]}, xs, ys, F.cross_entropy, pp.output_shapes(parts, xs[0])
    )
    sends = sum(r.op in ("send", "isend") for r in recording.records())
    dist.barrier()
    return {"res": res, "grads": _grads(model, [parts[rank]]), "recorded_sends": sends}


def _torch_case(rank: int, p: int, kind: str, m: int, v: int) -> dict:
    from torch.distributed.pipelining import (
        PipelineStage,
        ScheduleInterleavedZeroBubble,
        ScheduleZBVZeroBubble,
    )

    model, (x, y) = _model(), _batch()
    n = p * v
    parts = pp.split_sequential(model, n)
    # ZBV places stages in a V: rank r holds r and 2p − 1 − r; ZB1P round-robin
    ids = [rank, n - 1 - rank] if kind == "zbv" else pp.stages_of_rank(rank, p, n)
    stages = [PipelineStage(parts[s], s, n, torch.device("cpu")) for s in ids]
    cls = ScheduleZBVZeroBubble if kind == "zbv" else ScheduleInterleavedZeroBubble
    schedule = cls(stages, n_microbatches=m, loss_fn=F.cross_entropy)
    losses: list[torch.Tensor] = []
    args = (x,) if 0 in ids else ()
    kwargs = {"target": y, "losses": losses} if n - 1 in ids else {}
    schedule.step(*args, **kwargs)  # grads scaled by 1/m (scale_grads=True): a batch mean
    dist.barrier()
    return {
        "loss": float(sum(losses)) / m if losses else None,
        "grads": _grads(model, [parts[s] for s in ids]),
        "order": pp.actions_from_torch(schedule.pipeline_order),
    }


def _all_cases(rank: int, world_size: int) -> dict:
    return {
        "labkit": [_labkit_case(rank, world_size, m) for m in LABKIT_CASES[world_size]],
        "torch": [_torch_case(rank, world_size, *c) for c in TORCH_CASES[world_size]],
    }


_RUNS: dict[int, list[dict]] = {}


def _runs(world_size: int) -> list[dict]:
    if world_size not in _RUNS:  # one launch per world size runs every case
        _RUNS[world_size] = lk.launch(
            _all_cases, world_size=world_size, backend="labkit_record", device="cpu", timeout=180
        )
    return _RUNS[world_size]


@pytest.fixture(scope="module")
def reference() -> tuple[float, dict[str, torch.Tensor]]:
    model, (x, y) = _model(), _batch()
    loss = F.cross_entropy(model(x), y)  # the whole batch on one process
    loss.backward()
    return loss.item(), {n: q.grad.clone() for n, q in model.named_parameters()}


def _assert_equal_to_reference(per_rank: list[dict], loss: float, reference) -> None:
    grads: dict[str, torch.Tensor] = {}
    for out in per_rank:
        assert not set(grads) & set(out["grads"]), "a parameter lives on two ranks"
        grads.update(out["grads"])
    ref_loss, ref_grads = reference
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, **TOL, msg=lambda s, n=name: f"{n}: {s}")
    assert loss == pytest.approx(ref_loss, rel=1e-5)


def _params(cases: dict) -> list:
    marks = {4: pytest.mark.slow}
    return [
        pytest.param(p, i, id=f"p{p}-{c}", marks=marks.get(p, ()))
        for p in cases
        for i, c in enumerate(cases[p])
    ]


@pytest.mark.parametrize(("world_size", "index"), _params(LABKIT_CASES))
def test_zb_h1_runtime_equals_one_process(world_size, index, reference) -> None:
    m = LABKIT_CASES[world_size][index]
    per_rank = [r["labkit"][index] for r in _runs(world_size)]
    losses = [o["res"].loss for o in per_rank if o["res"].loss is not None]
    assert len(losses) == 1
    _assert_equal_to_reference(per_rank, losses[0], reference)
    expected_peak = pp.peak_in_flight(pp.zb_h1(world_size, m))
    for rank, out in enumerate(per_rank):
        # in flight from F to W, as the schedule says: min(p, m) per stage
        assert (
            out["res"].peak_in_flight == {rank: expected_peak[rank]} == {rank: min(world_size, m)}
        )
        # W sends nothing: as many messages as 1F1B, m per neighbouring stage
        sends = m * ((rank < world_size - 1) + (rank > 0))
        assert out["res"].n_sends == sends == out["recorded_sends"]


@pytest.mark.parametrize(("world_size", "index"), _params(TORCH_CASES))
def test_torch_zero_bubble_schedules_equal_one_process(world_size, index, reference) -> None:
    kind, m, v = TORCH_CASES[world_size][index]
    per_rank = [r["torch"][index] for r in _runs(world_size)]
    losses = [o["loss"] for o in per_rank if o["loss"] is not None]
    assert len(losses) == 1
    _assert_equal_to_reference(per_rank, losses[0], reference)
    order = per_rank[0]["order"]
    assert {a.op for row in order for a in row} == {"F", "B", "W"}  # torch splits B and W too
    if kind == "zb1p" and v == 1:  # ScheduleInterleavedZeroBubble, one stage per rank = ZB-H1
        assert order == pp.zb_h1_orders(world_size, m)


def test_measure_bubbles_rows_follow_the_theories() -> None:
    rows = pp.measure_bubbles(
        world_size=2, n_microbatches=4, compute_ms=10.0, backend="gloo", device="cpu", timeout=120
    )
    assert [r.kind for r in rows] == ["gpipe", "1f1b", "interleaved", "zb_h1"]
    theory = {r.kind: r.theory for r in rows}
    assert theory == pytest.approx(
        {"gpipe": 1 / 5, "1f1b": 1 / 5, "interleaved": 1 / 9, "zb_h1": 1 / 13}
    )
    for r in rows:
        # the schedule's idle slots cannot vanish; every hop only adds to them
        assert r.theory - 0.02 <= r.measured < 0.5, r  # 0.5 = (p − 1)/p, no pipelining at all
        assert r.step_ms >= 0.95 * r.ideal_ms, r
        assert r.timeline.world_size == 2  # the timed step, for lk.viz.schedule_vs_timeline
        assert pp.measured_bubble_fraction(r.timeline) == r.measured
    with pytest.raises(ValueError, match="unknown schedule"):
        pp.measure_bubbles(kinds=["zb_v"])
