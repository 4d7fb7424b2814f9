"""Tests for labkit/parallel/context: ring attention equal to full attention, counted, measured.

- no processes: the layouts as data (zig-zag balances the causal work, contiguous does not;
  PyTorch's head-tail load balancer is the zig-zag layout), the online softmax merging blocks
  in any order and its block backward equal to autograd, the traffic and memory formulas, and
  the plain attention's saved bytes and largest tensor (s×s) against the memory model;
- one 4-rank launch covering p = 2 (two subgroups of 2) and p = 4, causal and not, zig-zag and
  contiguous: outputs and q, k, v gradients equal to ``scaled_dot_product_attention`` of the
  whole sequence on one process, every message counted against the formula per phase, bytes
  kept for backward and the largest score block per rank against the memory model; on the CPU
  it also shows why PyTorch's ``context_parallel`` does not run there;
- on GPUs (marked ``gpu``): ring attention over NCCL, and PyTorch's ``context_parallel`` equal
  to full attention with its collectives counted.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import labkit as lk
from labkit.parallel import context as cp

B, A, S, D = 2, 2, 64, 4  # batch, heads, sequence, head dim (s ≫ d: the scores dominate)
TOL = {"rtol": 1e-5, "atol": 2e-6}  # float32 on the CPU, blocks merged in another order
GPU_TOL = {"rtol": 1e-4, "atol": 1e-5}  # float32 on GPUs: cuBLAS sums in yet other orders
CASES = list(itertools.product([True, False], cp.LAYOUTS))  # (causal, layout)
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


GPU_SHAPE = (2, 4, 256, 64)  # head dim 64: PyTorch's fused CUDA kernels (which CP needs) take it


def _qkv(seed: int = 0, shape: tuple[int, ...] = (B, A, S, D)) -> list[torch.Tensor]:
    """q, k, v and the output's gradient, (B, A, S, D) each."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(4)]


def _reference(causal: bool, shape: tuple[int, ...] = (B, A, S, D)) -> list[torch.Tensor]:
    q, k, v, dout = _qkv(0, shape)
    for t in (q, k, v):
        t.requires_grad_(True)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    y.backward(dout)
    return [y.detach(), q.grad, k.grad, v.grad]


# --- no processes ----------------------------------------------------------------------------


def test_layouts_as_data() -> None:
    assert cp.positions(0, 2, 8, "zigzag") == [0, 1, 6, 7]
    assert cp.positions(1, 2, 8, "zigzag") == [2, 3, 4, 5]
    assert cp.positions(1, 2, 8, "contiguous") == [4, 5, 6, 7]
    for p in (2, 4, 8):  # in chunk×chunk blocks: zig-zag 2p on every rank, contiguous r + ½
        assert cp.work_per_rank(p, "zigzag") == [2.0 * p] * p
        assert cp.work_per_rank(p, "contiguous") == [r + 0.5 for r in range(p)]
        assert cp.work_per_rank(p, "contiguous", causal=False) == [float(p)] * p
    x = torch.arange(2 * 3 * 16).reshape(2, 3, 16)
    for layout, p in itertools.product(cp.LAYOUTS, (1, 2, 4)):
        parts = [cp.shard_sequence(x, r, p, layout) for r in range(p)]
        assert torch.equal(cp.unshard_sequence(parts, layout), x)
        for r, part in enumerate(parts):
            assert part[0, 0].tolist() == cp.positions(r, p, 16, layout)
    with pytest.raises(ValueError, match="not divisible into 8 chunks"):
        cp.shard_sequence(x[..., :12], 0, 4, "zigzag")
    with pytest.raises(ValueError, match="layout must be one of"):
        cp.chunks_of(0, 2, "striped")


def test_pytorch_head_tail_balancer_is_the_zigzag_layout() -> None:
    from torch.distributed.tensor.experimental._context_parallel import _HeadTailLoadBalancer

    for p in (2, 4):
        order = _HeadTailLoadBalancer(32, p, "cpu")._generate_indices()[0].tolist()
        n = 32 // p
        for r in range(p):
            assert order[r * n : (r + 1) * n] == cp.positions(r, p, 32, "zigzag")


def test_online_softmax_merges_blocks_in_any_order_and_backward_matches_autograd() -> None:
    q, k, v, dout = (t.double() for t in _qkv(1))
    scale = D**-0.5
    for causal in (True, False):
        ref = cp.softmax_attention(q, k, v, causal=causal)
        assert torch.allclose(ref, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        qs, ks, vs = (t.chunk(4, dim=2) for t in (q, k, v))
        for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
            rows = []
            for i in range(4):
                out = lse = None
                for j in order:
                    kind = cp.block_kind(i, j, causal)
                    if kind != "skip":
                        o, l_ = cp.attention_block(qs[i], ks[j], vs[j], scale, kind)
                        out, lse = cp.merge_blocks(out, lse, o, l_)
                rows.append(out)
            torch.testing.assert_close(torch.cat(rows, 2), ref, rtol=1e-10, atol=1e-12)
        # one block that is the whole matrix (its own diagonal when causal): the backward from
        # the final log-normaliser equals autograd through the whole softmax
        kind = "diagonal" if causal else "full"
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        y = cp.softmax_attention(qq, kk, vv, causal=causal)
        y.backward(dout)
        out, lse = cp.attention_block(q, k, v, scale, kind)
        delta = (dout * out).sum(-1)
        grads = cp.attention_block_backward(q, k, v, dout, lse, delta, scale, kind)
        for got, want in zip(grads, (qq.grad, kk.grad, vv.grad), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_traffic_and_memory_formulas() -> None:
    t = lk.costmodel.ring_attention_traffic(4, 64, 2, 8)
    block = 2 * 16 * 8  # b · s/p · h
    assert (t.forward_messages, t.backward_messages, t.block_elements) == (6, 14, block)
    assert t.forward_bytes == 6 * block * 4 and t.backward_bytes == (6 + 8) * block * 4
    assert lk.costmodel.ring_attention_traffic(1, 64, 2, 8).backward_messages == 0
    bf16 = lk.costmodel.ring_attention_traffic(2, 64, 1, 8, bytes_per_element=2)
    assert bf16.backward_bytes == 2 * 32 * 8 * 2 + 4 * 32 * 8 * 4  # dK, dV stay fp32
    ring = lk.memory.attention_saved_bytes(S, B, A, D, kind="ring", world_size=4)
    assert ring == {"q, k, v, output": 4 * B * A * 16 * D * 4, "log-sum-exp": B * A * 16 * 4}
    assert lk.memory.score_block_bytes(S, B, A, 4, "zigzag") == B * A * 8 * 8 * 4
    with pytest.raises(ValueError, match="not divisible by 3 ranks"):
        lk.costmodel.ring_attention_traffic(3, 64, 2, 8)


@pytest.mark.parametrize("causal", [True, False])
def test_plain_attention_keeps_the_s_by_s_matrix(causal: bool) -> None:
    q, k, v, _ = _qkv()
    for t in (q, k, v):
        t.requires_grad_(True)
    with lk.profile.saved_tensors() as saved, lk.profile.largest_tensor() as big:
        cp.softmax_attention(q, k, v, causal=causal)
    model = lk.memory.attention_saved_bytes(S, B, A, D, causal=causal)
    assert saved.total_bytes == sum(model.values())
    assert big.nbytes == lk.memory.score_block_bytes(S, B, A) and big.shape == (B, A, S, S)


# --- ranks: p = 2 (two subgroups) and p = 4 in one launch -----------------------------------


def _cpu_context_parallel_refusal(world_size: int) -> str:
    """PyTorch's context_parallel on CPU tensors: the error it raises (the reason it cannot run)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cpu", (world_size,))
    q, k, v, _ = _qkv()
    try:
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
    except NotImplementedError as exc:
        return str(exc)
    return ""


def _ring_rank(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    dev = lk.get_device()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    out = {}
    for p, group in ((2, pairs[rank // 2]), (4, None)):
        r = dist.get_rank(group)
        for causal, layout in CASES:
            q, k, v, dout = (cp.shard_sequence(t, r, p, layout).to(dev) for t in _qkv())
            for t in (q, k, v):
                t.requires_grad_(True)
            with lk.collectives.count_messages() as msgs:
                with lk.profile.saved_tensors() as saved, lk.profile.largest_tensor() as big:
                    y = cp.ring_attention(q, k, v, group, causal=causal, layout=layout)
                fwd = msgs.summary()
                y.backward(dout)
            phases = {}
            for m in msgs.messages:
                key = (m.phase, m.direction, m.nbytes)
                phases[key] = phases.get(key, 0) + 1
            out[(p, causal, layout)] = {
                "grads": [t.detach().cpu() for t in (y, q.grad, k.grad, v.grad)],
                "fwd": fwd, "all": msgs.summary(), "phases": phases,
                "saved": saved.total_bytes, "largest": big.nbytes,
            }  # fmt: skip
    refusal = _cpu_context_parallel_refusal(world_size) if dev.type == "cpu" else None
    return {"cases": out, "refusal": refusal, "device": dev.type}


def test_ring_attention_equals_full_attention_counted_and_measured() -> None:
    refs = {causal: _reference(causal) for causal in (True, False)}
    out = lk.launch(_ring_rank, 4, timeout=180)
    tol = TOL if out[0]["device"] == "cpu" else GPU_TOL
    f = 4  # float32 bytes
    for p, (causal, layout) in itertools.product((2, 4), CASES):
        ranks = range(p) if p == 4 else (0, 1)  # p = 2: the subgroup {0, 1} ({2, 3} checked below)
        got = [out[r]["cases"][(p, causal, layout)] for r in ranks]
        for i, name in enumerate(("output", "dq", "dk", "dv")):
            whole = cp.unshard_sequence([g["grads"][i] for g in got], layout)
            torch.testing.assert_close(
                whole, refs[causal][i], **tol, msg=f"{p} {causal} {layout} {name}"
            )
        if p == 2:  # the other pair, ranks 2 and 3, computed the same thing
            for r in (0, 1):
                twin = out[r + 2]["cases"][(p, causal, layout)]["grads"]
                assert all(torch.equal(a, b) for a, b in zip(twin, got[r]["grads"], strict=True))
        traffic = lk.costmodel.ring_attention_traffic(p, S, B, A * D)
        block = traffic.block_elements * f  # bytes of one K, V, dK or dV block
        for r, g in zip(ranks, got, strict=True):
            n, nbytes = traffic.forward_messages, traffic.forward_bytes  # received as many
            want = {"messages_sent": n, "messages_received": n, "bytes_sent": nbytes,
                    "bytes_received": nbytes}  # fmt: skip
            assert g["fwd"] == want, (p, r, g["fwd"])
            total = traffic.forward_messages + traffic.backward_messages
            assert (
                g["all"]["messages_sent"] == total
                and g["all"]["bytes_sent"] == traffic.forward_bytes + traffic.backward_bytes
            )
            assert g["phases"] == {
                (ph, d, block): n
                for ph, n in (("kv", 2 * (p - 1)), ("kv (backward)", 2 * (p - 1)), ("dkv", 2 * p))
                for d in ("send", "recv")
            }, (p, r, g["phases"])  # fmt: skip
            # memory per rank: q, k, v, out and a fp32 log-sum-exp kept; one score block at a time
            kept = lk.memory.attention_saved_bytes(S, B, A, D, kind="ring", world_size=p)
            assert g["saved"] == sum(kept.values()), (p, r, g["saved"], kept)
            assert g["largest"] == lk.memory.score_block_bytes(S, B, A, p, layout), (
                p,
                layout,
                g["largest"],
            )
    refusal = out[0]["refusal"]
    if refusal is not None:  # CPU: PyTorch's ring handlers are for the CUDA kernels only
        assert "_scaled_dot_product_flash_attention_for_cpu" in refusal, refusal


# --- GPUs -----------------------------------------------------------------------------------


def _torch_cp_rank(rank: int, world_size: int):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.experimental import context_parallel

    dev = lk.get_device()
    mesh = init_device_mesh("cuda", (world_size,))
    q, k, v, dout = (t.to(dev) for t in _qkv(0, GPU_SHAPE))
    mine = cp.shard_sequence(dout, rank, world_size, "zigzag")  # head-tail = zig-zag
    with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2]):
        ql, kl, vl = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        with CommDebugMode() as fwd_comm:
            y = F.scaled_dot_product_attention(ql, kl, vl, is_causal=True)
        with CommDebugMode() as bwd_comm:
            y.backward(mine)
    counts = [{str(op).rsplit(".", 1)[-1]: n for op, n in c.get_comm_counts().items()}
              for c in (fwd_comm, bwd_comm)]  # fmt: skip
    # labkit's ring on the same GPUs, for comparison
    mine_qkv = (
        cp.shard_sequence(t, rank, world_size, "zigzag").to(dev) for t in _qkv(0, GPU_SHAPE)[:3]
    )
    ring = cp.ring_attention(*mine_qkv, causal=True)
    return [t.detach().cpu() for t in (y, ql.grad, kl.grad, vl.grad)], counts, ring.detach().cpu()


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs (one per rank)")
def test_pytorch_context_parallel_on_gpus() -> None:
    p = 4 if GPUS >= 4 else 2
    ref = _reference(True, GPU_SHAPE)
    out = lk.launch(_torch_cp_rank, p, device="cuda", timeout=240)
    for i, name in enumerate(("output", "dq", "dk", "dv")):
        whole = cp.unshard_sequence([o[0][i] for o in out], "zigzag")
        torch.testing.assert_close(whole, ref[i], rtol=1e-4, atol=1e-4, msg=name)
    ring = cp.unshard_sequence([o[2] for o in out], "zigzag")
    torch.testing.assert_close(ring, ref[0], rtol=1e-4, atol=1e-4)
    for _, (fwd, bwd), _ in out:
        # torch 2.13's _templated_ring_attention, default rotate method "allgather": one
        # all-gather of [K, V] forward; backward gathers them again and passes dK, dV round the
        # ring with p all_to_all_single (permute_tensor) calls.
        assert fwd == {"all_gather_into_tensor": 1}, fwd
        assert bwd == {"all_gather_into_tensor": 1, "all_to_all_single": p}, bwd
