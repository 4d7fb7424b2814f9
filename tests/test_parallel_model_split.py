"""Tests for labkit/parallel/model_split.py: a model split over 2, 3 and 4 ranks gives one
process's loss, gradients and parameters; messages counted; idle time; clear errors."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import labkit as lk
from labkit.parallel import model_split as ms
from labkit.parallel import pipeline as pp

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32; the same operations in the same order
BATCH, IN, HIDDEN, OUT = 8, 12, 16, 5
N_STEPS = 3
DELAY_MS = 30.0  # emulated compute per stage, in forward and again in backward
HOP_MS = 50.0  # allowed time per message hop between compute spans (loaded 2-core machine)
# world size → layer bounds (None: even split); 3 ranks get an uneven split of 11 layers
CASES = {2: None, 3: [0, 2, 3, 11], 4: None}


def _model() -> nn.Sequential:
    return lk.models.MLP(in_features=IN, hidden=(HIDDEN,) * 5, out_features=OUT, seed=3).net


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g))
        for _ in range(N_STEPS)
    ]


def _reference() -> dict:
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses, grads = [], None
    for x, y in _batches():
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.item())
        grads = grads or {n: q.grad.clone() for n, q in model.named_parameters()}
        opt.step()
    return {"losses": losses, "grads": grads, "params": dict(model.named_parameters())}


def _case(rank: int, world_size: int, bounds: list[int] | None) -> dict:
    from labkit.backends import recording

    model = _model()
    stages = ms.split_model(model, world_size, bounds)
    batches = _batches()
    split = ms.ModelSplit(stages[rank], ms.output_shapes(stages, batches[0][0]), F.cross_entropy)
    opt = torch.optim.Adam(stages[rank].parameters(), lr=1e-2)
    losses, first_grads, results = [], None, []
    recording.clear()
    for x, y in batches:
        opt.zero_grad()
        res = split.step(x if split.is_first else None, y if split.is_last else None)
        results.append(res)
        losses.append(res.loss)
        mine = {id(q) for q in stages[rank].parameters()}
        first_grads = first_grads or {
            n: q.grad.clone() for n, q in model.named_parameters() if id(q) in mine
        }
        opt.step()
    sends = [r.n_bytes for r in recording.records() if r.op in ("send", "isend")]
    memory = ms.measure_stage_memory(stages[rank], opt, results[-1].activation_bytes)
    params = {n: q.detach() for n, q in model.named_parameters() if id(q) in mine}
    # a timed step with emulated compute: only one rank at a time may compute
    timed = ms.ModelSplit(
        nn.Sequential(*stages[rank], lk.models.ComputeDelay(DELAY_MS, DELAY_MS)),
        split.shapes,
        F.cross_entropy,
    )
    x, y = batches[0]
    dist.barrier()
    lk.trace.reset()
    timed.step(x if split.is_first else None, y if split.is_last else None)
    return {
        "losses": losses,
        "grads": first_grads,
        "params": params,
        "results": results,
        "recorded_sends": sends,
        "memory": memory,
        "model": ms.stage_memory_model(stages[rank], BATCH),
        "events": lk.trace.events(),
    }


_RUNS: dict[int, list[dict]] = {}


def _runs(world_size: int) -> list[dict]:
    if world_size not in _RUNS:  # one launch per world size serves every test
        _RUNS[world_size] = lk.launch(
            _case, world_size, "labkit_record", args=(CASES[world_size],), device="cpu", timeout=120
        )
    return _RUNS[world_size]


@pytest.fixture(scope="module")
def reference() -> dict:
    return _reference()


WORLDS = [2, 3, 4]


@pytest.mark.parametrize("world_size", WORLDS)
def test_loss_grads_and_params_equal_one_process(world_size, reference) -> None:
    out = _runs(world_size)
    last = out[-1]["losses"]
    assert all(loss is None for o in out[:-1] for loss in o["losses"])
    assert last == pytest.approx(reference["losses"], rel=1e-5)
    grads, params = {}, {}
    for o in out:
        assert not set(grads) & set(o["grads"]), "a parameter lives on two ranks"
        grads.update(o["grads"])
        params.update(o["params"])
    assert set(grads) == set(reference["grads"]) == set(params)
    for name, g in reference["grads"].items():
        torch.testing.assert_close(grads[name], g, **TOL, msg=lambda s, n=name: f"{n}: {s}")
        torch.testing.assert_close(params[name], reference["params"][name].detach(), **TOL)


@pytest.mark.parametrize("world_size", WORLDS)
def test_messages_counted_by_the_recording_backend(world_size) -> None:
    out = _runs(world_size)
    nbytes = BATCH * HIDDEN * 4  # every boundary of this MLP carries (BATCH, HIDDEN) float32
    sends = [len(o["recorded_sends"]) for o in out]
    # per step: p − 1 activations forward and p − 1 gradients backward
    assert sum(sends) == N_STEPS * 2 * (world_size - 1)
    assert sends == [N_STEPS * (1 if r in (0, world_size - 1) else 2) for r in range(world_size)]
    assert all(b == nbytes for o in out for b in o["recorded_sends"])
    for o in out:
        assert sum(r.n_sends for r in o["results"]) == len(o["recorded_sends"])
        assert sum(r.bytes_sent for r in o["results"]) == sum(o["recorded_sends"])


@pytest.mark.parametrize("world_size", WORLDS)
def test_memory_per_stage_matches_the_model(world_size) -> None:
    for o in _runs(world_size):
        got, model = o["memory"], o["model"]
        assert got.params_bytes == model.params_bytes > 0
        assert got.grads_bytes == model.grads_bytes
        assert got.activation_bytes == model.activation_bytes > 0
        # Adam also keeps a 4-byte step counter per parameter tensor (weight, bias)
        assert got.optimizer_bytes - model.optimizer_bytes == 4 * len(o["params"])


@pytest.mark.parametrize("world_size", WORLDS)
def test_one_rank_computes_at_a_time_and_idles_p_minus_1_over_p(world_size) -> None:
    timeline = lk.trace.Timeline.merge([o["events"] for o in _runs(world_size)])
    busy_spans = [s for s in timeline.spans if "op" in s.args]
    assert len(busy_spans) == 2 * world_size
    for a in busy_spans:  # causality: a stage starts only after its neighbour's message
        for b in busy_spans:
            if a.rank != b.rank:
                assert a.end_ns <= b.start_ns or b.end_ns <= a.start_ns
    busy = [sum(s.duration_ns for s in busy_spans if s.rank == r) for r in range(world_size)]
    assert min(busy) >= 2 * DELAY_MS * 1e6  # a sleep never ends early
    # with the stage times measured, theory says 1 − t_r/Σt; the step adds 2(p − 1) hops
    theory = ms.idle_fraction_theory(busy)
    step = max(s.end_ns for s in busy_spans) - min(s.start_ns for s in busy_spans)
    assert sum(busy) <= step <= sum(busy) + 2 * (world_size - 1) * HOP_MS * 1e6
    measured = ms.idle_fractions(timeline)
    for got, th, t in zip(measured, theory, busy, strict=True):
        assert got == pytest.approx(1 - t / step)
        assert th - 1e-9 <= got <= 1 - t / (sum(busy) + 2 * (world_size - 1) * HOP_MS * 1e6)
    equal = ms.idle_fraction_theory([1.0] * world_size)
    assert equal == [pytest.approx((world_size - 1) / world_size)] * world_size
    mean = sum(measured) / world_size
    assert mean == pytest.approx(pp.measured_bubble_fraction(timeline), abs=1e-9)


def test_more_stages_than_layers_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="cannot cut 11 layers into 12 stages"):
        ms.split_model(_model(), 12)
    for bad in ([0, 5, 5, 11], [1, 5, 11], [0, 5, 10]):
        with pytest.raises(ValueError, match="non-empty stages"):
            ms.split_model(_model(), len(bad) - 1, bad)


def _wrong_shapes(rank: int, world_size: int, mode: str) -> None:
    stages = ms.split_model(_model(), world_size)
    x, y = _batches()[0]
    shapes = ms.output_shapes(stages, x)
    if mode == "count":
        shapes = shapes[:-1]
    elif mode == "agreed":
        shapes[0] = (BATCH, HIDDEN + 1)  # every rank agrees on a shape stage 0 does not make
    split = ms.ModelSplit(stages[rank], shapes, F.cross_entropy, timeout_s=20)
    split.step(x if rank == 0 else None, y if rank == world_size - 1 else None)


@pytest.mark.parametrize(
    ("mode", "match"),
    [
        ("count", r"2 agreed shapes for 3 ranks"),
        ("agreed", r"stage 0 produced shape \(8, 16\) but the agreed shape is \(8, 17\)"),
    ],
)
def test_mismatched_shapes_fail_fast_with_a_clear_error(mode, match) -> None:
    with pytest.raises(lk.RankError, match=match) as info:
        lk.launch(_wrong_shapes, 3, "gloo", args=(mode,), device="cpu", timeout=60)
    assert all(f.exc_type in ("ValueError", "RuntimeError") for f in info.value.failures.values())


def _silent_neighbour(rank: int, world_size: int) -> str:
    stages = ms.split_model(_model(), world_size)
    x, y = _batches()[0]
    split = ms.ModelSplit(stages[rank], ms.output_shapes(stages, x), F.cross_entropy, timeout_s=1)
    if rank == 0:
        time.sleep(3)  # never sends: rank 1's receive must give up after 1 s, not hang
        return "silent"
    try:
        split.step(None, y)
    except RuntimeError as exc:  # gloo closes the pair on a timeout: no collective after it
        return str(exc)
    return "received"


def test_a_missing_message_times_out() -> None:
    out = lk.launch(_silent_neighbour, 2, "gloo", device="cpu", timeout=60)
    assert out[0] == "silent" and "Timed out" in out[1]


def test_activation_model_counts_each_kept_tensor_once() -> None:
    stage = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), lk.models.ComputeDelay(), nn.Linear(6, 3))
    # input (4), ReLU output = second Linear's input (6), output (3)
    assert ms.activation_bytes_model(stage, batch_size=2) == 2 * 4 * (4 + 6 + 3)
    with pytest.raises(ValueError, match="no activation rule for Tanh"):
        ms.activation_bytes_model(nn.Sequential(nn.Linear(2, 2), nn.Tanh()), 1)


def test_memory_model_uses_lk_memory() -> None:
    stage = nn.Sequential(nn.Linear(10, 10))  # 110 parameters
    model = ms.stage_memory_model(stage, batch_size=1)
    ref = lk.memory.zero_memory(110, 1, 0, param_bytes=4, grad_bytes=4, optimizer_bytes=8)
    assert (model.params_bytes, model.grads_bytes, model.optimizer_bytes) == (440, 440, 880)
    assert model.params_bytes + model.grads_bytes + model.optimizer_bytes == ref.total_bytes


def test_idle_fraction_theory() -> None:
    assert ms.idle_fraction_theory([2, 1, 1]) == [0.5, 0.75, 0.75]
    assert ms.idle_fraction_theory([1] * 4)[0] == pytest.approx(pp.bubble_fraction_theory(4, 1))
    with pytest.raises(ValueError):
        ms.idle_fraction_theory([])
