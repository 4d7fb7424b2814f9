"""Tests for labkit/parallel/compose: the apply_* chain, equal to one process, collectives counted.

- arithmetic without processes: copies per piece, the refusals, stage names, activation
  checkpointing (names kept, gradients equal, the block run twice), ``clip_grad_norm_`` against
  ``torch.nn.utils.clip_grad_norm_``;
- one 4-rank launch on the recording backend: DP×TP, DP×TP with activation checkpointing,
  DP×PP and FSDP2×TP on an MLP stack, plain SGD, each equal to one process's parameters and
  each axis's collectives per step counted against the formulas;
- one 2-rank launch: gradient accumulation over 4 micro-batches under DDP, ZeRO-1/2/3 and
  FSDP2 (Adam), equal to one process, with one data-parallel reduction per optimizer step;
- one 4-rank launch: ``parallelize(..., sp=True)`` (``apply_sp``) on two transformer blocks,
  DP×SP with labkit's layers and DDP, and SP with DTensor's plan on 4 tp ranks, equal to one
  process after two SGD steps, with every all-gather, reduce-scatter and all-reduce counted.

The capstone's strategies (TinyGPT, the whole recipe, DCP resume) are in tests/test_capstone.py.
"""

from __future__ import annotations

import collections

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as lk
from labkit.mesh import ParallelDims
from labkit.models import FeedForward
from labkit.parallel import compose
from labkit.parallel.compose import Piece, copies

H, HIDDEN, N_BLOCKS, BATCH = 8, 16, 4, 8  # width, MLP width, blocks, global batch
STEPS, LR, M = 3, 0.1, 2  # SGD steps, learning rate, pipeline micro-batches
TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32 sums taken in another order
BLOCKS = [str(i) for i in range(N_BLOCKS)]


def _model() -> nn.Sequential:
    return nn.Sequential(*[FeedForward(H, HIDDEN, seed=10 + i) for i in range(N_BLOCKS)])


def _plan() -> dict[str, str]:
    return {f"{b}.{k}": v for b in BLOCKS for k, v in lk.parallel.tensor.MLP_PLAN.items()}


def _data(n: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(14)
    return torch.randn(n, H, generator=g), torch.randn(n, H, generator=g)


def _sgd_reference() -> dict[str, torch.Tensor]:
    model, (x, y) = _model(), _data()
    for _ in range(STEPS):
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
                p.grad = None
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --- no processes -------------------------------------------------------------------------


def test_copies_count_every_element_once() -> None:
    dims, t = ParallelDims(dp=2, pp=2, tp=2), torch.zeros(2)
    assert copies(Piece("0.ln.weight", t), dims) == 4  # replicated over dp and tp
    assert copies(Piece("1.fc1.weight", t, {"tp": 0}), dims) == 2  # Megatron slice, DDP copies
    assert copies(Piece("1.fc1.weight", t, {"dp": 0}), ParallelDims(dp=4)) == 1  # ZeRO shard


def test_parallelize_refuses_what_does_not_compose() -> None:
    cases = [
        (ParallelDims(dp=2, tp=2), {"dp": "zero2", "tp_plan": _plan()}, "pure data parallelism"),
        (ParallelDims(dp=2, pp=2), {"dp": "fsdp", "example": torch.zeros(1)}, "FSDP2 × PP"),
        (ParallelDims(dp=2, tp=2), {"dp": "fsdp", "tp_plan": _plan()}, "DTensor TP only"),
        (ParallelDims(dp=2, tp=2), {"tp_plan": _plan(), "tp_style": "dtensor"}, "megatron"),
        (ParallelDims(tp=2, dp=1), {}, "needs a tp_plan"),
        (ParallelDims(pp=2, dp=1), {}, "needs an example"),
        (ParallelDims(dp=2), {"dp": "zero4"}, "dp flavour must be one of"),
        (ParallelDims(pp=2, tp=2, dp=1), {"sp": True, "example": torch.zeros(1)}, "× PP"),
        (ParallelDims(dp=2, tp=2), {"dp": "fsdp", "tp_style": "dtensor", "sp": True}, "FSDP2 ×"),
    ]
    for dims, kwargs, match in cases:
        with pytest.raises(ValueError, match=match):
            compose.parallelize(_model(), dims, None, **kwargs)


def test_pipeline_stage_keeps_the_whole_models_names() -> None:
    stage = compose.PipelineStage(_model()[2:4], 1, 2, None, M, [(H,)] * 2, first_layer=2)
    assert stage.global_name("0.fc1.weight") == "2.fc1.weight" and stage.is_last
    plan = stage.local_names(_plan())
    assert plan == {"0.fc1": "colwise", "0.fc2": "rowwise", "1.fc1": "colwise", "1.fc2": "rowwise"}


def test_apply_ac_keeps_names_and_gradients_and_recomputes() -> None:
    x, y = _data()
    plain, checked = _model(), compose.apply_ac(_model(), BLOCKS)
    assert [n for n, _ in plain.named_parameters()] == [n for n, _ in checked.named_parameters()]
    calls = collections.Counter()
    for name, mod in checked.named_modules():
        if name.endswith("fc1"):
            mod.register_forward_hook(lambda m, i, o, name=name: calls.update([name]))
    for model in (plain, checked):
        F.mse_loss(model(x), y).backward()
    for (n, p), q in zip(plain.named_parameters(), checked.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=0, atol=0, msg=n)  # same arithmetic
    assert set(calls.values()) == {2}  # forward, and again in backward
    with pytest.raises(KeyError, match="not a submodule"):
        compose.apply_ac(_model(), ["9"])


def test_clip_grad_norm_equals_torch_on_one_process() -> None:
    x, y = _data()
    for max_norm in (0.05, 1e3):  # clipping, and a norm below the bound (factor 1)
        ours, theirs = _model(), _model()
        for model in (ours, theirs):
            F.mse_loss(model(x), y).backward()
        pieces = [Piece(n, p) for n, p in ours.named_parameters()]
        got = compose.clip_grad_norm_(pieces, max_norm, ParallelDims(1))
        want = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
        for p, q in zip(ours.parameters(), theirs.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        compose.clip_grad_norm_(pieces, 0.0, ParallelDims(1))


# --- 4 ranks: the hybrids, SGD, collectives per axis ----------------------------------------

HYBRIDS = {
    "dp_tp": (ParallelDims(dp=2, tp=2), {}),
    "dp_tp_ac": (ParallelDims(dp=2, tp=2), {"ac": BLOCKS}),
    "dp_pp": (ParallelDims(dp=2, pp=2), {"microbatches": M}),
    "fsdp_tp": (ParallelDims(dp=2, tp=2), {"dp": "fsdp", "tp_style": "dtensor"}),
}


CHAINS = {  # torchtitan's order: pp, tp, ac, then dp
    "dp_tp": ["apply_tp", "apply_ddp"],
    "dp_tp_ac": ["apply_tp", "apply_ac", "apply_ddp"],
    "dp_pp": ["apply_pp", "apply_ddp"],
    "fsdp_tp": ["apply_tp", "apply_fsdp"],
}


def _hybrids_rank(rank, world_size):
    recording = lk.backends.recording
    out = {}
    for name, (dims, kwargs) in HYBRIDS.items():
        mesh = lk.mesh.build_mesh(dims)
        x, y = _data()
        parts = compose.parallelize(_model(), dims, mesh, tp_plan=_plan(), example=x[:1], **kwargs)
        axis_of = {tuple(g): a for a in dims.mesh_axes for g in dims.group_ranks(a)}
        calls = collections.Counter()
        for n, mod in parts.model.named_modules():
            if n.endswith("fc1"):
                mod.register_forward_hook(lambda *_, calls=calls: calls.update(["fc1"]))
        steps = []
        for _ in range(STEPS):
            recording.clear()
            compose.train_sgd(parts, x, y, F.mse_loss, 1, LR)
            steps.append(
                collections.Counter(
                    (axis_of[tuple(sorted(r.participants))], r.op, r.n_bytes)
                    for r in recording.records()
                )
            )
        local_bytes = sum(compose.pieces.local(p).nbytes for p in parts.params)
        out[name] = (compose.full_parameters(parts), steps, parts.chain, calls["fc1"], local_bytes)
    return out


def test_hybrids_equal_one_process_with_each_axis_counted() -> None:
    ref = _sgd_reference()
    out = lk.launch(_hybrids_rank, 4, lk.backends.recording.spec("gloo"), device="cpu", timeout=240)
    b, f = BATCH // 2, 4  # samples per dp replica, bytes per float
    tp_ops = N_BLOCKS + (N_BLOCKS - 1)  # g per block forward; f per block backward, not the 1st
    for rank, per_rank in enumerate(out):
        for name, (full, steps, chain, fc1_calls, local_bytes) in per_rank.items():
            assert full.keys() == ref.keys(), name
            for k, want in ref.items():
                torch.testing.assert_close(full[k], want, **TOL, msg=f"{name} rank {rank} {k}")
            if name == "dp_pp":
                want = {("pp", "send", b // M * H * f): M, ("pp", "recv", b // M * H * f): M,
                        ("dp", "all_reduce", local_bytes): 1}  # fmt: skip
            elif name == "fsdp_tp":
                unit = (HIDDEN // 2 * H + HIDDEN // 2) * f  # fc1's and fc2's tp-local bytes
                assert unit == (H * HIDDEN // 2 + H) * f
                want = {("tp", "all_reduce", b * H * f): tp_ops,
                        ("dp", "all_gather_into_tensor", unit): 2 * 2 * N_BLOCKS,
                        ("dp", "reduce_scatter_tensor", unit): 2 * N_BLOCKS}  # fmt: skip
            else:  # Megatron inside each tp group, one DDP bucket across
                want = {("tp", "all_reduce", b * H * f): tp_ops,
                        ("dp", "all_reduce", local_bytes): 1}  # fmt: skip
            assert all(dict(s) == want for s in steps), (name, rank, steps, want)
            # fc1 runs once per block held and micro-batch; apply_ac runs it again in backward
            held, runs = (N_BLOCKS // 2, M) if name == "dp_pp" else (N_BLOCKS, 1)
            assert fc1_calls == STEPS * held * runs * (2 if name == "dp_tp_ac" else 1), name
            order = [line.split("(")[0].split("= ")[-1] for line in chain]
            assert order == CHAINS[name], (name, chain)


# --- 2 ranks: accumulation, one reduction per optimizer step ---------------------------------

FLAVOURS = ["ddp", "zero1", "zero2", "zero3", "fsdp"]
K, ADAM_LR = 4, 1e-2  # micro-batches per step, Adam's learning rate


def _accumulation_rank(rank, world_size):
    recording = lk.backends.recording
    x, y = _data()
    out = {}
    for flavour in FLAVOURS:
        dims = ParallelDims(dp=2)
        parts = compose.parallelize(
            _model(), dims, lk.mesh.build_mesh(dims), dp=flavour, optimizer_kwargs={"lr": ADAM_LR}
        )
        opt = parts.make_adam()
        xs, ys = lk.mesh.dp_shard(x, dims, parts.mesh), lk.mesh.dp_shard(y, dims, parts.mesh)
        steps = []
        for _ in range(2):
            recording.clear()
            parts.zero_grad(opt)
            compose.forward_backward(parts, xs, ys, F.mse_loss, microbatches=K)
            parts.step(opt)
            steps.append(collections.Counter(r.op for r in recording.records()))
        out[flavour] = (compose.full_parameters(parts), steps)
    return out


def test_accumulation_reduces_once_per_step_under_every_dp_flavour() -> None:
    model, (x, y) = _model(), _data()
    opt = torch.optim.Adam(model.parameters(), lr=ADAM_LR)
    for _ in range(2):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    out = lk.launch(
        _accumulation_rank, 2, lk.backends.recording.spec("gloo"), device="cpu", timeout=240
    )
    units = 2 * N_BLOCKS  # fc1 and fc2 of every block
    want = {  # per optimizer step of K micro-batches: reductions once, gathers as each needs
        "ddp": {"all_reduce": 1},  # one bucket, after the last micro-batch only
        "zero1": {"reduce_scatter_tensor": units, "all_gather_into_tensor": units},
        "zero2": {"reduce_scatter_tensor": units, "all_gather_into_tensor": units},
        "zero3": {"reduce_scatter_tensor": units, "all_gather_into_tensor": 2 * K * units},
        "fsdp": {"reduce_scatter_tensor": units, "all_gather_into_tensor": 2 * K * units},
    }
    for rank, per_rank in enumerate(out):
        for flavour, (full, steps) in per_rank.items():
            for n, p in model.named_parameters():  # Adam: near-zero gradients move by ~lr
                torch.testing.assert_close(full[n], p.detach(), rtol=0, atol=ADAM_LR / 10)
            assert all(dict(s) == want[flavour] for s in steps), (flavour, rank, steps)


# --- sequence parallelism on the tp axis: apply_sp ------------------------------------------

SEQ, HEADS, SP_BLOCKS = 8, 4, 2  # tokens, heads; transformer blocks of width 16
SP_H = 16
SP_CASES = {  # labkit's layers under DDP, and DTensor's plan on 4 tp ranks
    "dp_sp": (ParallelDims(dp=2, tp=2), {}),
    "sp_dtensor": (ParallelDims(dp=1, tp=4), {"tp_style": "dtensor"}),
}


def _sp_model() -> nn.Sequential:
    from labkit.models import TransformerBlock

    return nn.Sequential(
        *[TransformerBlock(SP_H, HEADS, hidden=2 * SP_H, seed=20 + i) for i in range(SP_BLOCKS)]
    )


def _sp_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(13)
    return torch.randn(4, SEQ, SP_H, generator=g), torch.randn(4, SEQ, SP_H, generator=g)


def _sp_rank(rank, world_size):
    recording = lk.backends.recording
    out = {}
    for name, (dims, kwargs) in SP_CASES.items():
        mesh = lk.mesh.build_mesh(dims)
        parts = compose.parallelize(_sp_model(), dims, mesh, sp=True, **kwargs)
        axis_of = {tuple(g): a for a in dims.mesh_axes for g in dims.group_ranks(a)}
        x, y = _sp_data()
        steps = []
        for _ in range(2):
            recording.clear()
            compose.train_sgd(parts, x, y, F.mse_loss, 1, LR)
            steps.append(
                collections.Counter(
                    (
                        axis_of[tuple(sorted(r.participants))],
                        r.op.removesuffix("_coalesced"),
                        r.n_bytes,
                    )
                    for r in recording.records()
                )  # fmt: skip
            )
        out[name] = (compose.full_parameters(parts), steps, parts.chain)
    return out


def test_apply_sp_equals_one_process_with_its_collectives_counted() -> None:
    model, (x, y) = _sp_model(), _sp_data()
    for _ in range(2):
        F.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
                p.grad = None
    out = lk.launch(_sp_rank, 4, lk.backends.recording.spec("gloo"), device="cpu", timeout=240)
    f, n = 4, SP_BLOCKS
    for rank, per_rank in enumerate(out):
        for name, (full, steps, chain) in per_rank.items():
            for k, p in model.named_parameters():
                torch.testing.assert_close(full[k], p.detach(), **TOL, msg=f"{name} {rank} {k}")
            assert chain[0].startswith("apply_sp(model"), chain
            dims = SP_CASES[name][0]
            act = len(x) // dims.dp * SEQ * SP_H * f  # b·s·h of one dp replica
            sp_ops = lk.costmodel.sequence_parallel_collectives(n, regather=name == "dp_sp")
            # the input needs no gradient: entering the region costs nothing; leaving it
            # all-gathers the last block's output in forward
            ag = sp_ops["forward"]["all_gather"] + 1 + sp_ops["backward"]["all_gather"]
            rs = sp_ops["forward"]["reduce_scatter"] + sp_ops["backward"]["reduce_scatter"]
            want = {("tp", "all_gather_into_tensor", act): ag,
                    ("tp", "reduce_scatter_tensor", act): rs}  # fmt: skip
            if name == "dp_sp":  # one coalesced tp all-reduce of 6h per block, one DDP bucket
                h = SP_H  # per block: 8h² + 5h split over tp=2, 6h whole (LayerNorms, biases)
                local = n * ((8 * h * h + 5 * h) // 2 + 6 * h)
                want |= {("tp", "all_reduce", 6 * SP_H * n * f): 1,
                         ("dp", "all_reduce", local * f): 1}  # fmt: skip
            else:  # DTensor: each LayerNorm weight and bias all-reduced (Partial → Replicate)
                want |= {("tp", "all_reduce", SP_H * f): 4 * n}
            assert all(dict(s) == want for s in steps), (name, rank, steps, want)
