"""Tests for labkit/parallel/tensor: outputs and every gradient equal the unsplit model.

Each shard's gradient is compared with the matching slice of the unsplit model's gradient
(rows of a column-parallel layer, columns of a row-parallel weight, whole replicated
tensors), the input's gradient too; all-reduces are counted with the recording backend and
compared with Megatron's count; DTensor's ``parallelize_module`` gives the same numbers.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import labkit as lk
from labkit.models import FeedForward, SelfAttention, TransformerBlock
from labkit.parallel import tensor as tp

B, T, H = 2, 5, 16  # batch, sequence, model width
TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32, sums in a different order


def _model(kind: str) -> nn.Module:
    if kind == "mlp":
        return FeedForward(H, 32, seed=1)
    if kind == "attention":
        return SelfAttention(H, n_heads=4, seed=2)
    return TransformerBlock(H, n_heads=4, hidden=32, seed=3)


_PLANS = {"mlp": tp.MLP_PLAN, "attention": tp.ATTENTION_PLAN, "block": tp.block_plan()}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)


def _reference(kind: str):
    """Output, input gradient and parameter gradients of the unsplit model, one process."""
    model = _model(kind)
    x, w = _data()
    x.requires_grad_(True)
    y = model(x)
    (y * w).sum().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    return y.detach(), x.grad, grads


def _expected_shard(full: torch.Tensor, name: str, plan: dict[str, str], rank: int, p: int):
    """The slice of an unsplit tensor that rank ``rank`` of ``p`` must hold, by Megatron §3."""
    style = plan.get(name.rsplit(".", 1)[0])
    if style == "colwise":  # rows of W and of b
        return full.chunk(p, dim=0)[rank]
    if style == "rowwise" and name.endswith("weight"):  # columns of W; b is replicated
        return full.chunk(p, dim=-1)[rank]
    return full


def _labkit_rank(rank: int, world_size: int, kind: str, g_ref: dict[str, torch.Tensor]):
    from labkit.backends import recording

    model = tp.apply_tensor_parallel(_model(kind), _PLANS[kind])
    x, w = _data()
    x.requires_grad_(True)
    recording.clear()
    y = model(x)
    fwd = [r.n_bytes for r in recording.records() if r.op == "all_reduce"]
    (y * w).sum().backward()
    both = [r.n_bytes for r in recording.records() if r.op == "all_reduce"]
    return {
        "y": y.detach(),
        "x_grad": x.grad,
        "grads": {n: p.grad for n, p in model.named_parameters()},
        "slices": tp.matching_slices(model, g_ref),
        "fwd": fwd,
        "bwd": both[len(fwd) :],
    }


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("kind", ["mlp", "attention", "block"])
def test_labkit_tensor_parallel_equals_unsplit(kind: str, world_size: int) -> None:
    y_ref, xg_ref, g_ref = _reference(kind)
    results = lk.launch(_labkit_rank, world_size, "labkit_record", args=(kind, g_ref))
    fwd_ar, bwd_ar = tp.all_reduces_per_step(kind)
    for rank, res in enumerate(results):
        torch.testing.assert_close(res["y"], y_ref, **TOL)
        torch.testing.assert_close(res["x_grad"], xg_ref, **TOL)
        assert set(res["grads"]) == set(g_ref)
        for name, grad in res["grads"].items():
            want = _expected_shard(g_ref[name], name, _PLANS[kind], rank, world_size)
            torch.testing.assert_close(grad, want, **TOL, msg=f"rank {rank} {name}")
            assert torch.equal(res["slices"][name], want), name  # matching_slices agrees
        # Megatron §3: each g (forward) and each f (backward) is one all-reduce of B·T·h floats.
        assert res["fwd"] == [B * T * H * 4] * fwd_ar, (rank, res["fwd"])
        assert res["bwd"] == [B * T * H * 4] * bwd_ar, (rank, res["bwd"])


def _dtensor_plan(kind: str):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    return {name: styles[style]() for name, style in _PLANS[kind].items()}


def _dtensor_rank(rank: int, world_size: int, kind: str):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    model = parallelize_module(_model(kind), mesh, _dtensor_plan(kind))
    x, w = _data()
    x.requires_grad_(True)
    y = model(x)
    (y * w).sum().backward()
    grads = {
        n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        for n, p in model.named_parameters()
    }
    local = {n: p.to_local() for n, p in model.named_parameters() if isinstance(p, DTensor)}
    return {"y": y.detach(), "x_grad": x.grad, "grads": grads, "local_shapes": local}


@pytest.mark.parametrize("kind", ["mlp", "block"])
def test_dtensor_parallelize_module_equals_unsplit(kind: str) -> None:
    y_ref, xg_ref, g_ref = _reference(kind)
    for rank, res in enumerate(lk.launch(_dtensor_rank, 2, args=(kind,))):
        torch.testing.assert_close(res["y"], y_ref, **TOL)
        torch.testing.assert_close(res["x_grad"], xg_ref, **TOL)
        for name, grad in res["grads"].items():
            torch.testing.assert_close(grad, g_ref[name], **TOL, msg=f"rank {rank} {name}")
        # DTensor shards the same way as labkit: rank r holds chunk r of W's rows or columns
        for name, shard in res["local_shapes"].items():
            want = _expected_shard(dict(_model(kind).named_parameters())[name], name,
                                   _PLANS[kind], rank, 2)  # fmt: skip
            torch.testing.assert_close(shard, want.detach(), rtol=0, atol=0)


def _errors_rank(rank: int, world_size: int) -> list[str]:
    out = []
    for plan, model in [
        ({"fc1": "diagonal"}, FeedForward(H, 32)),
        ({"nope": "colwise"}, FeedForward(H, 32)),
        ({"act": "colwise"}, FeedForward(H, 32)),
        ({"fc1": "colwise"}, FeedForward(H, 33)),
    ]:
        try:
            tp.apply_tensor_parallel(model, plan)
        except (ValueError, KeyError, TypeError) as exc:
            out.append(f"{type(exc).__name__}: {exc}")
    try:
        tp.parallelize_attention(SelfAttention(H, n_heads=2))
    except ValueError as exc:
        out.append(str(exc))
    return out


def test_bad_plans_are_rejected_with_a_reason() -> None:
    msgs = lk.launch(_errors_rank, 4)[0]
    assert len(msgs) == 5, msgs
    assert "unknown style 'diagonal'" in msgs[0]
    assert msgs[1].startswith("KeyError") and "not a submodule" in msgs[1]
    assert msgs[2] == "TypeError: 'act' is a GELU, not an nn.Linear"
    assert "cannot split 33 features into 4 equal shards" in msgs[3]
    assert msgs[4] == "2 heads cannot be split over 4 ranks"


def test_all_reduce_counts_follow_megatron() -> None:
    # Megatron-LM §3: 2 all-reduces forward and 2 backward per layer with fused QKV; our
    # separate q, k and v layers each need their own f in backward.
    assert tp.all_reduces_per_step("mlp") == (1, 1)
    assert tp.all_reduces_per_step("block") == tuple(
        a + m for a, m in zip(tp.all_reduces_per_step("attention"), (1, 1), strict=True)
    )
