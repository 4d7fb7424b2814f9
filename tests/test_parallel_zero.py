"""labkit.parallel.zero: ZeRO stages 1–3 and FSDP2 train to single-process Adam's parameters,
issue the expected collectives, and hold the bytes ``labkit.memory`` predicts.

Collectives are counted with the recording backend (``backend="labkit_record"``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import labkit as lk
from labkit.parallel import zero

STEPS = 3
LR = 1e-2
# Averaging over ranks and Adam's division by sqrt(v) reorder float32 roundings: measured
# up to ~2e-7 apart after 3 steps.
TOL = dict(rtol=1e-5, atol=1e-6)
MAX_RATIO_OFF = 0.10  # measured bytes within 10% of the model


def _model() -> torch.nn.Module:
    # 13·37 + 37 + 37·23 + 23 + 23·3 + 3 = 1464 parameters; biases of 37, 23 and 3 elements
    # do not divide by 2 or 4 ranks, so every stage pads.
    return lk.models.MLP(in_features=13, hidden=(37, 23), out_features=3, seed=0)


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(4, 13, generator=g), torch.randint(0, 3, (4,), generator=g)


def _reference(world_size: int) -> list[dict[str, torch.Tensor]]:
    """torch.optim.Adam on one process with every rank's batch, parameters after each step."""
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    out = []
    for step in range(STEPS):
        xs, ys = zip(*(_batch(step, r) for r in range(world_size)), strict=True)
        opt.zero_grad()
        F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
        out.append({n: p.detach().clone() for n, p in model.named_parameters()})
    return out


def _train_all_stages(rank: int, world_size: int) -> dict:
    from labkit.backends import recording

    out = {}
    for stage in (1, 2, 3):
        model = _model()
        opt = zero.ZeroOptimizer(model, stage, lr=LR)
        params, ops, shard_grads = [], [], []
        for step in range(STEPS):
            recording.clear()
            x, y = _batch(step, rank)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            if step == 0:
                shard_grads = [q.grad.clone() for q in opt.shards]
            opt.zero_grad()
            ops.append([(r.op, r.n_bytes) for r in recording.records()])
            params.append(opt.full_parameters())
        at_rest = opt.rank_bytes().total_bytes
        with torch.no_grad():  # an evaluation forward gathers and frees again
            eval_out = model(_batch(0, rank)[0])
        out[stage] = {
            "params": params,
            "eval_matches": torch.allclose(
                eval_out, _reference_model(params[-1])(_batch(0, rank)[0]), rtol=1e-5, atol=1e-6
            ),
            "rest_after_eval": (at_rest, opt.rank_bytes().total_bytes),
            "shapes": [tuple(q.shape) for q in model.parameters()],
            "partial_grad_error": _partial_gradient_error(stage) if stage >= 2 else "",
            "ops": ops,
            "measured": opt.rank_bytes(),
            "held": zero.storage_bytes(opt.held_tensors()),
            "model": opt.model_bytes(),
            "peak": opt.peak_bytes,
            "shard_numel": sum(s.numel() for s in opt.shards),
            "shard_grads": shard_grads,
        }
    return out


def _reference_model(params: dict[str, torch.Tensor]) -> torch.nn.Module:
    model = _model()
    model.load_state_dict(params)
    return model


class _HalfUsed(torch.nn.Module):
    """One unit of two parameters whose forward uses only the first."""

    def __init__(self) -> None:
        super().__init__()
        self.used = torch.nn.Parameter(torch.ones(5))
        self.unused = torch.nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.used


def _partial_gradient_error(stage: int) -> str:
    model = _HalfUsed()
    opt = zero.ZeroOptimizer(model, stage)
    model(torch.ones(5)).sum().backward()
    try:
        opt.step()
    except RuntimeError as exc:
        return str(exc)
    return ""


@pytest.fixture(scope="module", params=[2, 4], ids=["2ranks", "4ranks"])
def runs(request) -> tuple[int, list[dict]]:
    world_size = request.param
    return world_size, lk.launch(
        _train_all_stages, world_size, backend="labkit_record", timeout=180
    )


# --- no processes ----------------------------------------------------------------------------


def test_shard_bounds_pad_every_parameter_to_a_multiple_of_the_world_size():
    assert [zero.shard_bounds(10, 4, r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert zero.shard_size(3, 4) == 1 and zero.shard_size(0, 4) == 1
    with pytest.raises(ValueError, match=r"rank must be in \[0, 4\)"):
        zero.shard_bounds(10, 4, 4)


def test_pack_then_unpack_returns_every_parameter():
    model = _model()
    for unit in zero.find_units(model, 4):
        packed = unit.pack([p.detach().reshape(-1) for p in unit.params], 4)
        assert packed.shape == (4, unit.shard_numel)
        for got, p in zip(unit.unpack(packed), unit.params, strict=True):
            torch.testing.assert_close(got, p.detach(), rtol=0, atol=0)


def test_units_are_the_linear_layers():
    units = zero.find_units(_model(), 2)
    assert [u.name for u in units] == ["net.0", "net.2", "net.4"]
    assert [u.names for u in units] == [["weight", "bias"]] * 3


def test_unknown_stage_is_rejected():
    with pytest.raises(ValueError, match="stage must be 1, 2 or 3"):
        zero.ZeroOptimizer(_model(), 4)


# --- on ranks --------------------------------------------------------------------------------


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_gives_single_process_adams_parameters_after_each_step(runs, stage):
    world_size, res = runs
    for want, *got in zip(_reference(world_size), *(r[stage]["params"] for r in res), strict=True):
        for rank_params in got:
            assert rank_params.keys() == want.keys()
            for name in want:
                torch.testing.assert_close(rank_params[name], want[name], **TOL)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_rank_gets_the_reduced_gradient_of_its_shard(runs, stage):
    # ZeRO §5.1 and §7.2.1: after the reduce-scatter a rank holds the gradient of the whole
    # batch, averaged over ranks, for its own padded shard of every parameter, nothing more.
    world_size, res = runs
    model = _model()
    xs, ys = zip(*(_batch(0, r) for r in range(world_size)), strict=True)
    F.cross_entropy(model(torch.cat(xs)), torch.cat(ys)).backward()
    for rank, out in enumerate(res):
        want = []
        for q in model.parameters():
            lo, hi = zero.shard_bounds(q.numel(), world_size, rank)
            flat = q.grad.reshape(-1)
            want.append(torch.cat([flat, flat.new_zeros(max(0, hi - flat.numel()))])[lo:hi])
        got = out[stage]["shard_grads"]
        assert [g.numel() for g in got] == [w.numel() for w in want]
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)


def test_collectives_per_step(runs):
    _, res = runs
    n_units = 3
    ag, rs = "all_gather_into_tensor", "reduce_scatter_tensor"
    expected = {
        1: [rs] * n_units + [ag] * n_units,  # reduce-scatter grads in step(), gather params
        2: [rs] * n_units + [ag] * n_units,  # reduce-scatter during backward
        3: [ag] * n_units + [ag, rs] * n_units,  # gather each layer in forward and backward
    }
    for out in res:
        for stage, ops in expected.items():
            assert [[op for op, _ in step] for step in out[stage]["ops"]] == [ops] * STEPS, stage


def test_stages_1_and_2_move_data_parallelisms_bytes_and_stage_3_half_as_much_again(runs):
    # ZeRO §7.2.1-7.2.2: a reduce-scatter and an all-gather of Ψ (2Ψ, the same as DDP's one
    # all-reduce of Ψ) for stages 1 and 2, one more all-gather for stage 3 (3Ψ). The recording
    # backend counts nccl-tests' size: the whole (padded) buffer, N_d · S elements per unit.
    world_size, res = runs
    padded = 4 * world_size * sum(u.shard_numel for u in zero.find_units(_model(), world_size))
    for out in res:
        for stage, (n_rs, n_ag) in {1: (1, 1), 2: (1, 1), 3: (1, 2)}.items():
            for step in out[stage]["ops"]:
                by_op = {op: sum(n for o, n in step if o == op) for op, _ in step}
                assert by_op == {
                    "reduce_scatter_tensor": n_rs * padded,
                    "all_gather_into_tensor": n_ag * padded,
                }, stage


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_measured_bytes_per_rank_are_within_10_percent_of_the_model(runs, stage):
    world_size, res = runs
    for out in res:
        measured, model = out[stage]["measured"], out[stage]["model"]
        want = lk.memory.zero_rank_bytes(_model(), world_size, stage, padding="per_parameter")
        assert model == want
        for part in ("params_bytes", "grads_bytes", "optimizer_bytes", "total_bytes"):
            ratio = getattr(measured, part) / getattr(model, part)
            assert abs(ratio - 1) <= MAX_RATIO_OFF, (part, ratio)
        # the sharded states are exactly one padded shard per parameter (Adam: m and v)
        s = out[stage]["shard_numel"]
        assert measured.optimizer_bytes == 8 * s + 4 * 6  # + one fp32 step counter per tensor
        if stage >= 2:
            assert measured.grads_bytes == 4 * s
        if stage == 3:
            assert measured.params_bytes == 4 * s


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_held_tensors_are_the_storages_rank_bytes_counts(runs, stage):
    # held_tensors() feeds other counts (the CUDA allocator's blocks in notebook 13): its
    # distinct storages must be exactly what rank_bytes adds up.
    _, res = runs
    for out in res:
        assert out[stage]["held"] == out[stage]["measured"].total_bytes > 0


def test_shapes_evaluation_forward_and_missing_gradients(runs):
    world_size, res = runs
    full = [tuple(q.shape) for q in _model().parameters()]
    for out in res:
        for stage in (1, 2, 3):
            assert out[stage]["eval_matches"], stage
            before, after = out[stage]["rest_after_eval"]
            assert before == after, stage  # nothing gathered is left behind
        assert out[1]["shapes"] == out[2]["shapes"] == full
        # ZeRO-3's registered parameters are this rank's 1-D shards
        assert out[3]["shapes"] == [(zero.shard_size(q.numel(), world_size),) for q in
                                    _model().parameters()]  # fmt: skip
        for stage in (2, 3):
            assert "received only some of their gradients" in out[stage]["partial_grad_error"]


def test_each_stage_lowers_the_peak(runs):
    _, res = runs
    for out in res:
        assert out[1]["peak"] > out[2]["peak"] > out[3]["peak"]
        for stage in (1, 2, 3):
            assert out[stage]["peak"] >= out[stage]["measured"].total_bytes


# --- FSDP2 -----------------------------------------------------------------------------------


def _fsdp2(rank: int, world_size: int) -> dict:
    model = zero.apply_fully_shard(_model())
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    params = []
    for step in range(STEPS):
        x, y = _batch(step, rank)
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        params.append({n: p.full_tensor().detach() for n, p in model.named_parameters()})
    return {"params": params, "bytes": zero.fsdp_rank_bytes(model, opt)}


def test_fsdp2_gives_the_same_parameters_and_about_zero3s_bytes():
    world_size = 2
    res = lk.launch(_fsdp2, world_size, backend="gloo", timeout=180)
    model = lk.memory.zero_rank_bytes(_model(), world_size, 3, padding="per_parameter")
    for want, *got in zip(_reference(world_size), *(r["params"] for r in res), strict=True):
        for rank_params in got:
            for name in want:
                torch.testing.assert_close(rank_params[name], want[name], **TOL)
    total = sum(r["bytes"].total_bytes for r in res)
    # FSDP2 pads dim 0 of each parameter, ZeRO-3 here the flat parameter: both ≈ 16Ψ/N_d
    assert abs(total / world_size / model.total_bytes - 1) <= MAX_RATIO_OFF


def test_each_stage_reads_alone():
    """No stage inherits another's gradient handling: 1 and 2 share only the full parameters
    (ReplicatedParameters), 2 and 3 only the gradient shards filled in backward."""
    import inspect

    from labkit.parallel.zero.base import GradientShards
    from labkit.parallel.zero.replicated import ReplicatedParameters

    assert not issubclass(zero.ZeroStage2, zero.ZeroStage1)
    assert issubclass(zero.ZeroStage1, ReplicatedParameters)
    assert issubclass(zero.ZeroStage2, ReplicatedParameters)
    assert not issubclass(zero.ZeroStage3, ReplicatedParameters)
    base = inspect.getsource(zero.ZeroBase)
    assert "self.stage ==" not in base and "getattr(" not in base
    for cls in (zero.ZeroStage2, zero.ZeroStage3):
        assert "GradientShards(self)" in inspect.getsource(cls._shard)
    assert "GradientShards" not in inspect.getsource(zero.ZeroStage1)
    assert callable(GradientShards.check_all_reduced)
