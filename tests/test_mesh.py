"""Tests for labkit/mesh.py: degrees validated, groups as init_device_mesh lays them out, and
DP×TP and DP×PP on 4 ranks (2×2) ending with the parameters of one process on the full batch.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as lk
from labkit.mesh import ParallelDims
from labkit.models import FeedForward

H, HIDDEN, N_LAYERS, BATCH = 8, 16, 4, 8  # width, MLP width, blocks, global batch
STEPS, LR, M = 3, 0.1, 2  # SGD steps, learning rate, micro-batches
TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32 sums taken in another order


def _model() -> nn.Sequential:
    return nn.Sequential(*[FeedForward(H, HIDDEN, seed=10 + i) for i in range(N_LAYERS)])


def _tp_plan() -> dict[str, str]:
    mlp = lk.parallel.tensor.MLP_PLAN
    return {f"{i}.{name}": style for i in range(N_LAYERS) for name, style in mlp.items()}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(14)
    return torch.randn(BATCH, H, generator=g), torch.randn(BATCH, H, generator=g)


def _reference() -> dict[str, torch.Tensor]:
    """One process, whole batch, plain SGD: the parameters every hybrid must reach."""
    model = _model()
    x, y = _data()
    for _ in range(STEPS):
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
                p.grad = None
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# ParallelDims: pure arithmetic


def test_dims_validated_with_the_arithmetic():
    d = ParallelDims(dp=2, pp=1, tp=2, world_size=4)
    assert d.mesh_axes == ("dp", "tp") and d.mesh_shape == (2, 2)
    assert ParallelDims(dp=8).world_size == 8
    assert ParallelDims(1).mesh_axes == ("dp",) and ParallelDims(1).mesh_shape == (1,)
    with pytest.raises(ValueError, match=r"dp\(2\) \* pp\(2\) \* tp\(2\) = 8 != world_size\(4\)"):
        ParallelDims(dp=2, pp=2, tp=2, world_size=4)
    with pytest.raises(ValueError, match="dp=2, pp=1, tp=2"):  # suggests factorizations of 4
        ParallelDims(dp=3, world_size=4)
    for bad in ({"dp": 0}, {"dp": 2, "tp": -1}, {"dp": 1.5}, {"dp": True}):
        with pytest.raises(ValueError, match="must be an int >= 1"):
            ParallelDims(**bad)
    with pytest.raises(ValueError, match="unknown axis"):
        d.degree("ep")


def test_group_ranks_row_major_tp_innermost():
    d = ParallelDims(dp=2, pp=2, tp=2)
    assert d.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert d.group_ranks("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert d.group_ranks("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert d.coordinates(5) == {"dp": 1, "pp": 0, "tp": 1}
    with pytest.raises(ValueError, match="outside"):
        d.coordinates(8)


# On 4 ranks


def _groups_rank(rank, world_size, dp, pp, tp, world=4):
    import torch.distributed as dist

    dims = ParallelDims(dp, pp, tp, world_size=world)
    mesh = lk.mesh.build_mesh(dims)
    groups = {a: dist.get_process_group_ranks(lk.mesh.axis_group(mesh, a)) for a in dims.mesh_axes}
    try:
        lk.mesh.axis_group(mesh, "pp" if pp == 1 else "tp")
        missing = None
    except ValueError as exc:
        missing = str(exc)
    return groups, lk.mesh.coordinates(mesh), mesh.mesh.tolist(), missing


@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 1, 2), (2, 2, 1)])
def test_groups_match_init_device_mesh(dp, pp, tp):
    dims = ParallelDims(dp, pp, tp)
    out = lk.launch(_groups_rank, 4, "gloo", args=(dp, pp, tp), device="cpu", timeout=120)
    for rank, (groups, coords, layout, missing) in enumerate(out):
        assert coords == dims.coordinates(rank)
        for axis, ranks in groups.items():
            assert ranks in dims.group_ranks(axis) and rank in ranks
        assert layout == torch.arange(4).reshape(dims.mesh_shape).tolist()
        assert "has degree 1 and no group" in missing
    with pytest.raises(lk.RankError, match="needs 8 ranks"):
        lk.launch(_groups_rank, 4, "gloo", args=(2, 2, 2, None), device="cpu", timeout=60)


def _dp_tp_rank(rank, world_size):
    dims = ParallelDims(dp=2, tp=2, world_size=world_size)
    mesh = lk.mesh.build_mesh(dims)
    x, y = _data()
    times: list[float] = []
    model, losses = lk.mesh.train_dp_tp(
        _model(), _tp_plan(), dims, mesh, x, y, F.mse_loss, STEPS, LR, step_times=times
    )
    assert len(times) == STEPS and all(t > 0 for t in times)
    return {n: p.detach() for n, p in model.named_parameters()}, losses


def _dp_pp_rank(rank, world_size):
    dims = ParallelDims(dp=2, pp=2, world_size=world_size)
    mesh = lk.mesh.build_mesh(dims)
    x, y = _data()
    model = _model()
    times: list[float] = []
    _, losses = lk.mesh.train_dp_pp(
        model, dims, mesh, x, y, F.mse_loss, STEPS, LR, M, step_times=times
    )
    assert len(times) == STEPS and all(t > 0 for t in times)
    held = range(0, N_LAYERS // 2) if lk.mesh.axis_rank(mesh, "pp") == 0 else range(2, N_LAYERS)
    keep = {n: p.detach() for n, p in model.named_parameters() if int(n.split(".")[0]) in held}
    return keep, losses


def test_dp_tp_equals_one_process():
    ref = _reference()
    out = lk.launch(_dp_tp_rank, 4, "gloo", device="cpu", timeout=120)
    dims = ParallelDims(dp=2, tp=2)
    for rank, (params, losses) in enumerate(out):
        tp_rank = dims.coordinates(rank)["tp"]
        assert len(losses) == STEPS
        for name, got in params.items():
            want = ref[name]
            style = _tp_plan().get(name.rsplit(".", 1)[0])
            if style == "colwise":
                want = want.chunk(2, dim=0)[tp_rank]
            elif style == "rowwise" and name.endswith("weight"):
                want = want.chunk(2, dim=-1)[tp_rank]
            torch.testing.assert_close(got, want, **TOL, msg=f"rank {rank} {name}")
        assert set(params) == set(ref)


def test_dp_pp_equals_one_process():
    ref = _reference()
    out = lk.launch(_dp_pp_rank, 4, "gloo", device="cpu", timeout=120)
    seen = set()
    for rank, (params, losses) in enumerate(out):
        assert params, f"rank {rank} holds no parameters"
        for name, got in params.items():
            torch.testing.assert_close(got, ref[name], **TOL, msg=f"rank {rank} {name}")
        seen |= set(params)
        is_last = ParallelDims(dp=2, pp=2).coordinates(rank)["pp"] == 1
        assert all((v is not None) == is_last for v in losses)
    assert seen == set(ref)  # the two stages together hold every parameter


def test_training_functions_reject_the_wrong_dims():
    dims = ParallelDims(dp=2, pp=2)
    with pytest.raises(ValueError, match="pp=1"):
        lk.mesh.train_dp_tp(_model(), {}, dims, None, *_data(), F.mse_loss, 1, LR)
    with pytest.raises(ValueError, match="tp=1"):
        lk.mesh.train_dp_pp(_model(), ParallelDims(2, 1, 2), None, *_data(), F.mse_loss, 1, LR, 2)
