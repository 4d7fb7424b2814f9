"""Tests for labkit/parallel/pipeline/runtime.py and split.py: every schedule's gradients equal
one process's, and torch.distributed.pipelining agrees."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import labkit as lk
from labkit.parallel import pipeline as pp

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32: micro-batch sums reorder the additions
BATCH = 16
# (schedule, n_microbatches, n_virtual) per world size; interleaved needs m % p == 0
CASES = {
    2: [("gpipe", 4, 1), ("1f1b", 4, 1), ("1f1b", 1, 1), ("interleaved", 4, 2), ("swapped", 4, 1)],
    4: [("gpipe", 4, 1), ("1f1b", 4, 1), ("gpipe", 8, 1), ("1f1b", 8, 1), ("interleaved", 8, 2)],
}
TORCH_CASES = {2: [("gpipe", 4, 1), ("1f1b", 4, 1), ("interleaved", 4, 2)], 4: [("1f1b", 8, 1)]}


def _model() -> torch.nn.Sequential:
    return lk.models.MLP(in_features=12, hidden=(16,) * 7, out_features=5, seed=3).net


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, 12, generator=g), torch.randint(0, 5, (BATCH,), generator=g)


def swapped_gpipe(p: int, m: int) -> pp.Schedule:
    """GPipe whose last stage runs micro-batch 1 before 0: valid, received out of send order."""
    orders = [[pp.Action(s, "F", i) for i in range(m)] for s in range(p)]
    orders[-1][0], orders[-1][1] = orders[-1][1], orders[-1][0]
    orders = [o + [pp.Action(s, "B", i) for i in range(m)] for s, o in enumerate(orders)]
    return pp.place(orders, p)


def _schedule(kind: str, p: int, m: int, v: int) -> pp.Schedule:
    if kind == "swapped":
        return swapped_gpipe(p, m)
    if kind == "interleaved":
        return pp.interleaved_one_f_one_b(p, m, v)
    return {"gpipe": pp.gpipe, "1f1b": pp.one_f_one_b}[kind](p, m)


def _grads_of(model: torch.nn.Module, stages) -> dict[str, torch.Tensor]:
    mine = {id(q) for s in stages for q in s.parameters()}
    return {n: q.grad.clone() for n, q in model.named_parameters() if id(q) in mine}


def _labkit_case(rank: int, p: int, kind: str, m: int, v: int) -> dict:
    from labkit.backends import recording

    model, (x, y) = _model(), _batch()
    parts = pp.split_sequential(model, p * v)
    xs, ys = list(x.chunk(m)), list(y.chunk(m))
    mine = {s: parts[s] for s in pp.stages_of_rank(rank, p, p * v)}
    recording.clear()
    res = pp.run_schedule(
        _schedule(kind, p, m, v), mine, xs, ys, F.cross_entropy, pp.output_shapes(parts, xs[0])
    )
    recorded = sum(r.op in ("send", "isend") for r in recording.records())
    dist.barrier()
    return {"res": res, "grads": _grads_of(model, mine.values()), "recorded_sends": recorded}


def _torch_case(rank: int, p: int, kind: str, m: int, v: int) -> dict:
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    model, (x, y) = _model(), _batch()
    parts = pp.split_sequential(model, p * v)
    ids = pp.stages_of_rank(rank, p, p * v)
    stages = [PipelineStage(parts[s], s, p * v, torch.device("cpu")) for s in ids]
    if kind == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=F.cross_entropy)
    else:
        cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind]
        schedule = cls(stages[0], n_microbatches=m, loss_fn=F.cross_entropy)
    losses: list[torch.Tensor] = []
    args = (x,) if 0 in ids else ()
    kwargs = {"target": y, "losses": losses} if p * v - 1 in ids else {}
    schedule.step(*args, **kwargs)  # grads scaled by 1/m (scale_grads=True): a batch mean
    dist.barrier()
    loss = float(sum(losses)) / m if losses else None
    return {"loss": loss, "grads": _grads_of(model, [parts[s] for s in ids])}


def _two_pipelines(rank: int) -> dict:
    """Ranks {0, 2} and {1, 3} each run a 2-stage 1F1B pipeline in their own group."""
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank creates both
    group = groups[rank % 2]
    model, (x, y) = _model(), _batch()
    parts = pp.split_sequential(model, 2)
    xs, ys = list(x.chunk(4)), list(y.chunk(4))
    stage = dist.get_rank(group)
    res = pp.run_schedule(
        pp.one_f_one_b(2, 4), {stage: parts[stage]}, xs, ys, F.cross_entropy,
        pp.output_shapes(parts, xs[0]), group=group,
    )  # fmt: skip
    dist.barrier()
    return {"res": res, "grads": _grads_of(model, [parts[stage]])}


def _all_cases(rank: int, world_size: int) -> dict:
    return {
        "labkit": [(c, _labkit_case(rank, world_size, *c)) for c in CASES[world_size]],
        "torch": [(c, _torch_case(rank, world_size, *c)) for c in TORCH_CASES[world_size]],
        "groups": _two_pipelines(rank) if world_size == 4 else None,
    }


@pytest.fixture(scope="module")
def reference() -> tuple[float, dict[str, torch.Tensor]]:
    model, (x, y) = _model(), _batch()
    loss = F.cross_entropy(model(x), y)  # the whole batch on one process
    loss.backward()
    return loss.item(), {n: q.grad.clone() for n, q in model.named_parameters()}


_RUNS: dict[int, list[dict]] = {}


def _runs(world_size: int) -> list[dict]:
    if world_size not in _RUNS:  # one launch per world size runs every case
        _RUNS[world_size] = lk.launch(
            _all_cases, world_size=world_size, backend="labkit_record", device="cpu", timeout=180
        )
    return _RUNS[world_size]


def _merged(per_rank: list[dict]) -> dict[str, torch.Tensor]:
    grads: dict[str, torch.Tensor] = {}
    for out in per_rank:
        assert not set(grads) & set(out["grads"]), "a parameter lives on two ranks"
        grads.update(out["grads"])
    return grads


def _case_ids(cases) -> list[str]:
    return [f"{k}-m{m}-v{v}" for k, m, v in cases]


def _assert_equal_to_reference(grads, loss, reference) -> None:
    ref_loss, ref_grads = reference
    assert set(grads) == set(ref_grads)
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, **TOL, msg=lambda s, n=name: f"{n}: {s}")
    assert loss == pytest.approx(ref_loss, rel=1e-5)


def _params(cases: dict) -> list:
    """One test per (world size, case); the 4-rank launch is marked slow (~10 s on 2 cores)."""
    marks = {4: pytest.mark.slow}
    return [
        pytest.param(p, i, id=f"p{p}-{c}", marks=marks.get(p, ()))
        for p in cases
        for i, c in enumerate(_case_ids(cases[p]))
    ]


@pytest.mark.parametrize(("world_size", "index"), _params(CASES))
def test_labkit_runtime_equals_one_process(world_size, index, reference) -> None:
    case, _ = _runs(world_size)[0]["labkit"][index]
    kind, m, v = case
    per_rank = [r["labkit"][index][1] for r in _runs(world_size)]
    losses = [o["res"].loss for o in per_rank if o["res"].loss is not None]
    assert len(losses) == 1  # only the last stage's rank computes the loss
    _assert_equal_to_reference(_merged(per_rank), losses[0], reference)
    schedule = _schedule(kind, world_size, m, v)
    n_stages = world_size * v
    expected_peak = pp.peak_in_flight(schedule)
    for rank, out in enumerate(per_rank):
        res = out["res"]
        # activations kept = what the schedule predicts, stage by stage
        assert res.peak_in_flight == {s: expected_peak[s] for s in res.peak_in_flight}
        stages = pp.stages_of_rank(rank, world_size, n_stages)
        sends = m * (sum(s < n_stages - 1 for s in stages) + sum(s > 0 for s in stages))
        assert res.n_sends == sends == out["recorded_sends"]
    if kind in ("gpipe", "swapped"):
        assert all(o["res"].peak_in_flight == {r: m} for r, o in enumerate(per_rank))
    # generated schedules keep each pair's messages in order (NCCL needs it); gloo's tags
    # let the swapped one run too
    assert pp.messages_in_order(schedule, n_stages) == (kind != "swapped")
    if kind == "1f1b":
        assert all(max(o["res"].peak_in_flight.values()) <= world_size for o in per_rank)


@pytest.mark.parametrize(("world_size", "index"), _params(TORCH_CASES))
def test_torch_pipelining_equals_one_process(world_size, index, reference) -> None:
    per_rank = [r["torch"][index][1] for r in _runs(world_size)]
    losses = [o["loss"] for o in per_rank if o["loss"] is not None]
    assert len(losses) == 1
    _assert_equal_to_reference(_merged(per_rank), losses[0], reference)


@pytest.mark.slow
def test_two_pipelines_in_their_own_groups(reference) -> None:
    out = [r["groups"] for r in _runs(4)]
    for ranks in ([0, 2], [1, 3]):
        per_rank = [out[r] for r in ranks]
        losses = [o["res"].loss for o in per_rank if o["res"].loss is not None]
        _assert_equal_to_reference(_merged(per_rank), losses[0], reference)
        assert [o["res"].n_sends for o in per_rank] == [4, 4]


def test_split_sequential_shares_layers_and_balances() -> None:
    model = _model()  # 15 layers
    parts = pp.split_sequential(model, 4)
    assert [len(s) for s in parts] == [4, 4, 4, 3]
    assert [m for s in parts for m in s] == list(model)
    x = torch.randn(3, 12)
    out = x
    for s in parts:
        out = s(out)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)
    assert pp.output_shapes(parts, x) == [(3, 16), (3, 16), (3, 16), (3, 5)]
    with pytest.raises(ValueError, match="cannot cut 15 layers into 16"):
        pp.split_sequential(model, 16)


def test_run_schedule_rejects_a_schedule_for_another_world_size() -> None:
    def fn(rank, world_size):
        parts = pp.split_sequential(_model(), 2)
        x, y = _batch()
        try:
            pp.run_schedule(pp.gpipe(3, 2), {rank: parts[rank]}, [x], [y], F.cross_entropy, [])
        except ValueError as exc:
            return str(exc)
        return "no error"

    out = lk.launch(fn, world_size=2, backend="gloo", device="cpu", timeout=60)
    assert out == ["the schedule has 3 rows for 2 ranks"] * 2


def test_run_schedule_refuses_out_of_order_messages_without_tags() -> None:
    def fn(rank, world_size):
        parts = pp.split_sequential(_model(), 2)
        x, y = _batch()
        xs, ys = list(x.chunk(4)), list(y.chunk(4))
        get_backend = dist.get_backend
        dist.get_backend = lambda group=None: "nccl"  # NCCL matches in order, ignoring tags
        try:
            shapes = pp.output_shapes(parts, xs[0])
            pp.run_schedule(swapped_gpipe(2, 4), {rank: parts[rank]}, xs, ys, F.cross_entropy,
                            shapes)  # fmt: skip
        except ValueError as exc:
            return str(exc)
        finally:
            dist.get_backend = get_backend
        return "no error"

    out = lk.launch(fn, world_size=2, backend="gloo", device="cpu", timeout=60)
    assert all("receives some messages out of order" in msg for msg in out)
