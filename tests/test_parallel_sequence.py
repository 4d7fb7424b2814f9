"""Tests for labkit/parallel/sequence: sequence parallelism equal to the unsplit block, counted.

- arithmetic, no processes: the tensor-by-tensor activation model sums to Korthikanti et al.'s
  closed forms (2022, §4) under their assumptions, the collective counts of TP and SP, and the
  bytes per rank they send being equal;
- one launch per world size (2 and 4 ranks, the recording backend over gloo): labkit's
  sequence-parallel block (re-gathering its GEMM inputs in backward, or keeping them) and
  DTensor's ``SequenceParallel`` plan, each equal to the unsplit block on one process (output,
  input gradient, every parameter gradient), each collective counted with its size, and the
  bytes autograd keeps per rank equal to the activation model — to the byte — for the unsplit
  block, tensor parallelism, and both sequence-parallel variants;
- on GPUs (marked ``gpu``): the same equalities over NCCL, collectives counted by
  ``CommDebugMode``.
"""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch

import labkit as lk
from labkit.models import TransformerBlock
from labkit.parallel import sequence as sp
from labkit.parallel import tensor as tp

B, T, H, A, F = 2, 8, 16, 4, 32  # batch, sequence, width, heads, MLP width
TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32 sums in another order
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
# labkit's block, as it runs here: fp32, no dropout, scaled_dot_product_attention (flash on the
# CPU: output and log-sum-exp kept), LayerNorm statistics kept in fp32, MLP width F.
LABKIT_BLOCK = {
    "ffn_hidden": F,
    "bytes_per_element": 4,
    "attention": "flash",
    "dropout": False,
    "layernorm_stat_bytes": 4,
}
MATH = LABKIT_BLOCK | {"attention": "softmax"}  # sdpa_kernel(MATH): the probabilities kept


def _block() -> TransformerBlock:
    return TransformerBlock(H, n_heads=A, hidden=F, seed=3)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)


def _reference():
    """Output, input gradient, parameter gradients and saved bytes of the unsplit block."""
    block, (x, w) = _block(), _data()
    x.requires_grad_(True)
    with lk.profile.saved_tensors(exclude=block.parameters()) as saved:
        y = block(x)
    (y * w).sum().backward()
    grads = {n: p.grad for n, p in block.named_parameters()}
    return y.detach(), x.grad, grads, saved.total_bytes


# --- arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("seq_par", [False, True])
def test_terms_sum_to_korthikanti(t: int, seq_par: bool) -> None:
    # GPT-3 175B's layer (Korthikanti et al. 2022, Table 3): s=2048, b=1, h=12288, a=96.
    s, b, h, a = 2048, 1, 12288, 96
    terms = lk.memory.block_activation_terms(
        s, b, h, a, tensor_parallel=t, sequence_parallel=seq_par
    )
    want = lk.memory.activation_bytes_per_layer(
        s, b, h, a, tensor_parallel=t, sequence_parallel=seq_par
    )
    assert sum(terms.values()) == pytest.approx(want, rel=1e-12)
    closed = s * b * h * ((34 / t if seq_par else 10 + 24 / t) + 5 * a * s / (h * t))
    assert want == pytest.approx(closed, rel=1e-12)


def test_terms_without_the_regather_keep_the_gathered_inputs() -> None:
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    kept = lk.memory.block_activation_bytes(
        s, b, h, a, tensor_parallel=t, sequence_parallel=True, regather=False
    )
    # the q,k,v and fc1 inputs (2sbh each, 16-bit) stay whole: sbh(4 + 30/t + 5as/(ht))
    assert kept == pytest.approx(s * b * h * (4 + 30 / t + 5 * a * s / (h * t)), rel=1e-12)
    flash = lk.memory.block_activation_terms(s, b, h, a, attention="flash", dropout=False)
    assert "softmax output" not in flash and flash["log-sum-exp"] == 4 * a * s * b
    with pytest.raises(ValueError, match="attention must be one of"):
        lk.memory.block_activation_terms(s, b, h, a, attention="sparse")
    with pytest.raises(ValueError, match="tensor_parallel must be an int >= 1"):
        lk.memory.block_activation_terms(s, b, h, a, tensor_parallel=0)


def _saved_bytes(block: torch.nn.Module, x: torch.Tensor, kernel=None) -> int:
    """Bytes autograd keeps for one forward of ``block`` (optionally under one SDPA kernel)."""
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel(kernel) if kernel is not None else contextlib.nullcontext():
        with lk.profile.saved_tensors(exclude=block.parameters()) as saved:
            block(x)
    return saved.total_bytes


def test_unsplit_block_keeps_what_the_model_says() -> None:
    from torch.nn.attention import SDPBackend

    model, x = lk.memory.block_activation_bytes, _data()[0].requires_grad_(True)
    assert _saved_bytes(_block(), x) == model(T, B, H, A, **LABKIT_BLOCK)
    # the math kernel keeps the s×s probabilities: Korthikanti's attention, without dropout
    assert _saved_bytes(_block(), x, SDPBackend.MATH) == model(T, B, H, A, **MATH)
    # bf16 on the CPU: 2-byte activations, LayerNorm statistics in bf16 too, lse in fp32
    half = _saved_bytes(_block().bfloat16(), x.detach().bfloat16().requires_grad_(True))
    assert half == model(T, B, H, A, **LABKIT_BLOCK | {"bytes_per_element": 2,
                                                      "layernorm_stat_bytes": 2})  # fmt: skip


def test_collective_counts_and_bytes_per_rank() -> None:
    cost = lk.costmodel
    assert cost.tensor_parallel_collectives(3) == {
        "forward": {"all_reduce": 6},
        "backward": {"all_reduce": 12},
    }
    assert cost.tensor_parallel_collectives(1, fused_qkv=True)["backward"] == {"all_reduce": 2}
    assert cost.sequence_parallel_collectives(2, regather=False) == {
        "forward": {"all_gather": 4, "reduce_scatter": 4},
        "backward": {"all_gather": 4, "reduce_scatter": 4},
        "after_backward": {"all_reduce": 1},
    }
    assert cost.sequence_parallel_collectives(1, region=True)["backward"]["all_gather"] == 5
    for p in (2, 4, 8):  # each op moves N = b·s·h elements; a ring all-reduce = RS + AG
        ag, ar = cost.busbw_factor("all_gather", p), cost.busbw_factor("all_reduce", p)
        assert cost.busbw_factor("reduce_scatter", p) == ag
        fwd_sp = cost.sequence_parallel_collectives(1)["forward"]
        fwd_tp = cost.tensor_parallel_collectives(1)["forward"]
        assert fwd_sp["all_gather"] * ag + fwd_sp["reduce_scatter"] * ag == pytest.approx(
            fwd_tp["all_reduce"] * ar
        )
    with pytest.raises(ValueError, match="n_blocks must be an int >= 1"):
        cost.sequence_parallel_collectives(0)


# --- ranks: labkit's and DTensor's sequence parallelism ------------------------------------


def _ops(records) -> collections.Counter:
    """(op, bytes) counts, the coalesced forms DTensor issues named as the plain ones."""
    names = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}
    out = collections.Counter()
    for r in records:
        op = r.op.removesuffix("_coalesced")
        out[(names.get(op, op), r.n_bytes)] += 1
    return out


def _run(model, x, w, recording, after):
    """Forward (saved tensors recorded), backward, then ``after``; ops of each phase."""
    recording.clear()
    with lk.profile.saved_tensors(exclude=model.parameters()) as saved:
        y = model(x)
    fwd = list(recording.records())
    (y * w).sum().backward()
    bwd = list(recording.records())[len(fwd) :]
    after()
    rest = list(recording.records())[len(fwd) + len(bwd) :]
    return y.detach(), saved.total_bytes, [_ops(fwd), _ops(bwd), _ops(rest)]


def _labkit_case(regather: bool, g_ref):
    from torch.nn.attention import SDPBackend

    recording = lk.backends.recording
    block = sp.apply_sequence_parallel(_block(), regather=regather)
    x, w = (sp.split_sequence(t) for t in _data())
    x.requires_grad_(True)
    y, saved, ops = _run(block, x, w, recording, lambda: sp.reduce_sequence_parallel_grads(block))
    grads = {n: p.grad for n, p in block.named_parameters()}
    math = _saved_bytes(block, x.detach().requires_grad_(True), SDPBackend.MATH)  # a forward more
    return {"y": y, "x_grad": x.grad, "grads": grads, "want": tp.matching_slices(block, g_ref),
            "saved": saved, "saved_math": math, "ops": ops}  # fmt: skip


def _dtensor_case(world_size: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    recording = lk.backends.recording
    mesh = init_device_mesh(lk.get_device().type, (world_size,))
    block = sp.parallelize_sequence_dtensor(_block(), mesh, [""], region=False)
    x, w = (sp.split_sequence(t) for t in _data())
    x.requires_grad_(True)
    y, saved, ops = _run(block, x, w, recording, lambda: sp.replicate_partial_grads(block))
    grads = {
        n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        for n, p in block.named_parameters()
    }
    replicated = {  # after replicate_partial_grads: the LayerNorms' partial sums reduced
        n: p.grad.placements[0].is_replicate() for n, p in block.named_parameters() if "ln" in n
    }
    return {"y": y, "x_grad": x.grad, "grads": grads, "saved": saved, "ops": ops,
            "replicated": replicated}  # fmt: skip


def _tp_saved() -> int:
    """Bytes a tensor-parallel (not sequence-parallel) block keeps per rank."""
    block = tp.apply_tensor_parallel(_block(), tp.block_plan())
    with lk.profile.saved_tensors(exclude=block.parameters()) as saved:
        block(_data()[0].requires_grad_(True))
    return saved.total_bytes


def _sequence_rank(rank: int, world_size: int, g_ref) -> dict:
    return {
        "regather": _labkit_case(True, g_ref),
        "keep": _labkit_case(False, g_ref),
        "dtensor": _dtensor_case(world_size),
        "tp_saved": _tp_saved(),
    }


@pytest.mark.parametrize("world_size", [2, 4])
def test_sequence_parallel_equals_unsplit_counted_and_measured(world_size: int) -> None:
    y_ref, xg_ref, g_ref, saved_ref = _reference()
    out = lk.launch(
        _sequence_rank, world_size, lk.backends.recording.spec("gloo"), args=(g_ref,),
        device="cpu", timeout=180,
    )  # fmt: skip
    p, n = world_size, B * T * H * 4  # every all-gather / reduce-scatter moves b·s·h floats
    model = lk.memory.block_activation_bytes
    assert saved_ref == model(T, B, H, A, **LABKIT_BLOCK)  # the unsplit block, to the byte
    for rank, res in enumerate(out):
        mine = slice(rank * T // p, (rank + 1) * T // p)  # this rank's tokens
        for case in ("regather", "keep", "dtensor"):
            got = res[case]
            torch.testing.assert_close(got["y"], y_ref[:, mine], **TOL)
            torch.testing.assert_close(got["x_grad"], xg_ref[:, mine], **TOL)
            assert set(got["grads"]) == set(g_ref), case
            for name, grad in got["grads"].items():
                want = got["want"][name] if "want" in got else g_ref[name]
                torch.testing.assert_close(grad, want, **TOL, msg=f"{case} rank {rank} {name}")
            regather = case == "regather"
            counts = lk.costmodel.sequence_parallel_collectives(1, regather=regather)
            fwd, bwd, after = got["ops"]
            assert fwd == {(op, n): k for op, k in counts["forward"].items()}, (case, fwd)
            assert bwd == {(op, n): k for op, k in counts["backward"].items()}, (case, bwd)
            if case == "dtensor":  # each Partial LayerNorm gradient all-reduced: 4 of h floats
                assert after == {("all_reduce", H * 4): 4}, after
                assert all(got["replicated"].values()), got["replicated"]
            else:  # one coalesced all-reduce: ln1, ln2 (weight, bias), proj and fc2 biases
                assert after == {("all_reduce", 6 * H * 4): 1}, after
            # bytes kept for backward on this rank = the model, to the byte
            want = model(T, B, H, A, tensor_parallel=p, sequence_parallel=True,
                         regather=regather, **LABKIT_BLOCK)  # fmt: skip
            assert got["saved"] == want, (case, got["saved"], want)
            if case != "dtensor":  # with the probabilities kept: Korthikanti's 5as/(ht) part
                want = model(T, B, H, A, tensor_parallel=p, sequence_parallel=True,
                             regather=regather, **MATH)  # fmt: skip
                assert got["saved_math"] == want, (case, got["saved_math"], want)
        assert res["tp_saved"] == model(T, B, H, A, tensor_parallel=p, **LABKIT_BLOCK)
    # what the lesson prints: per rank, SP keeps 1/p of the unsplit block's activations here
    assert out[0]["regather"]["saved"] * p == saved_ref


def test_model_level_region_and_errors() -> None:
    def rank(rank: int, world_size: int):
        model = torch.nn.Sequential(_block(), TransformerBlock(H, A, hidden=F, seed=4))
        ref = [p.detach().clone() for p in model.parameters()]
        x, w = _data()
        want = torch.nn.Sequential(_block(), TransformerBlock(H, A, hidden=F, seed=4))(x)
        sp.apply_sequence_parallel(model)
        sp.add_sequence_region(model[0], model[1])
        y = model(x)
        (y * w).sum().backward()
        msgs = []
        for bad in (lambda: sp.apply_sequence_parallel(torch.nn.Linear(2, 2)),
                    lambda: sp.apply_sequence_parallel(_block(), blocks=["nope"]),
                    lambda: sp.split_sequence(torch.zeros(1, 3, 1)),
                    lambda: sp.gather_from_sequence(x, grad="sum")):  # fmt: skip
            try:
                bad()
            except (ValueError, KeyError) as exc:
                msgs.append(str(exc))
        n_sp = len(sp.sequence_parallel_params(model))
        return (y - want).abs().max().item(), len(ref), n_sp, msgs

    err, n_params, n_sp, msgs = lk.launch(rank, 2, device="cpu")[0]
    assert err < 1e-5 and n_params == 32 and n_sp == 12  # 6 per block
    assert "no transformer block" in msgs[0] and "not a submodule" in msgs[1]
    assert "sequence length 3 is not divisible by 2 ranks" in msgs[2]
    assert "grad must be 'reduce_scatter' or 'split'" in msgs[3]


# --- GPUs -----------------------------------------------------------------------------------


def _gpu_rank(rank: int, world_size: int, g_ref):
    from torch.distributed.tensor.debug import CommDebugMode

    dev = lk.get_device()
    block = sp.apply_sequence_parallel(_block().to(dev))
    x, w = (sp.split_sequence(t.to(dev)) for t in _data())
    x.requires_grad_(True)
    with CommDebugMode() as comm:
        y = block(x)
        (y * w).sum().backward()
    sp.reduce_sequence_parallel_grads(block)
    want = tp.matching_slices(block, {k: v.to(dev) for k, v in g_ref.items()})
    errs = {n: (p.grad - want[n]).abs().max().item() for n, p in block.named_parameters()}
    counts = {str(k): v for k, v in comm.get_comm_counts().items()}
    return y.cpu(), x.grad.cpu(), errs, counts


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs (one per rank)")
def test_sequence_parallel_on_gpus() -> None:
    p = 4 if GPUS >= 4 else 2  # heads (4) and tokens (8) split evenly
    y_ref, xg_ref, g_ref, _ = _reference()
    out = lk.launch(_gpu_rank, p, args=(g_ref,), device="cuda", timeout=180)
    for rank, (y, xg, errs, counts) in enumerate(out):
        mine = slice(rank * T // p, (rank + 1) * T // p)
        torch.testing.assert_close(y, y_ref[:, mine], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(xg, xg_ref[:, mine], rtol=1e-4, atol=1e-5)
        assert max(errs.values()) < 1e-4, errs
        # forward 2 AG + 2 RS, backward 4 AG (2 conjugates + 2 re-gathers) + 2 RS
        assert sorted(counts.values()) == [4, 6], counts
