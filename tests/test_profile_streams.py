"""Tests for labkit/profile/streams.py: collectives' threads, GPU kernels' streams, overlap.

Synthetic traces in Kineto's format stand in for a CUDA rank's; a 2-rank gloo DDP profile
checks the CPU side for real, and a GPU-marked test checks NCCL's stream on two GPUs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import labkit as lk

MAIN, AUTOGRAD, GLOO = 10, 11, 12  # thread ids
COMPUTE, NCCL = 7, 21  # stream ids


def _x(name, ts, dur, tid=MAIN, cat="cpu_op", pid=1, **args):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "cat": cat,
            "args": args}  # fmt: skip


def _kernel(name, ts, dur, stream, corr):
    return _x(name, ts, dur, tid=stream, cat="kernel", pid=0, device=0, stream=stream,
              correlation=corr)  # fmt: skip


def _launch(ts, tid, corr, cat="cuda_runtime"):
    return _x("cudaLaunchKernel", ts, 1, tid=tid, cat=cat, correlation=corr)


def _thread_name(tid, name):
    return {"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": name}}


def _cuda_trace():
    """One step: forward kernel (main), two backward kernels (autograd's thread), an NCCL
    all-reduce on its own stream overlapping the second by 30 µs, the optimizer (main)."""
    events = [
        _x("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        _x("ProfilerStep#1", 0, 1000, tid=COMPUTE, cat="gpu_user_annotation", pid=0),
        _launch(10, MAIN, 1), _kernel("ampere_sgemm_fwd", 100, 50, COMPUTE, 1),
        _launch(20, AUTOGRAD, 2), _kernel("ampere_sgemm_bwd1", 150, 100, COMPUTE, 2),
        _launch(30, AUTOGRAD, 3), _kernel("ampere_sgemm_bwd0", 260, 100, COMPUTE, 3),
        _launch(40, AUTOGRAD, 4, cat="cuda_driver"),
        _kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                330, 50, NCCL, 4),
        _launch(50, MAIN, 5), _kernel("multi_tensor_apply_kernel", 380, 20, COMPUTE, 5),
    ]  # fmt: skip
    return {"traceEvents": events}


def test_is_nccl_kernel_knows_both_naming_schemes() -> None:
    assert lk.profile.is_nccl_kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)")
    assert lk.profile.is_nccl_kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)")
    assert not lk.profile.is_nccl_kernel("ampere_sgemm_128x64_nn")
    assert not lk.profile.is_nccl_kernel("nccl:all_reduce")  # the CPU-side span, not a kernel


def test_gpu_kernels_reads_stream_device_and_launching_thread() -> None:
    kernels = lk.profile.gpu_kernels(_cuda_trace())
    assert [k.name[:17] for k in kernels] == ["ampere_sgemm_fwd", "ampere_sgemm_bwd1",
                                              "ampere_sgemm_bwd0", "ncclDevKernel_All",
                                              "multi_tensor_appl"]  # fmt: skip
    assert [k.from_main for k in kernels] == [True, False, False, False, True]
    assert {k.stream for k in kernels} == {COMPUTE, NCCL} and {k.device for k in kernels} == {0}
    assert lk.profile.gpu_kernels({"traceEvents": [_x("ProfilerStep#1", 0, 9)]}) == []


def test_nccl_overlap_counts_only_backward_kernels_on_other_streams() -> None:
    res = lk.profile.nccl_overlap(_cuda_trace())
    assert (res.n_nccl, res.nccl_streams, res.compute_streams) == (1, (NCCL,), (COMPUTE,))
    # NCCL runs 330-380; backward kernels 150-250 and 260-360; the optimizer's kernel at
    # 380-400 was launched by the training thread and does not count
    assert res.nccl_us == 50 and res.overlap_us == 30 and res.n_backward == 2
    assert res.overlap_fraction == pytest.approx(0.6)


def test_nccl_overlap_without_launch_records_counts_every_compute_kernel() -> None:
    trace = _cuda_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["cat"] != "cuda_runtime"]
    res = lk.profile.nccl_overlap(trace)  # only the NCCL launch (cuda_driver) is left
    assert res.n_backward == 4 and res.overlap_us == 30


def test_nccl_overlap_of_a_cpu_trace_is_empty() -> None:
    res = lk.profile.nccl_overlap({"traceEvents": [_x("ProfilerStep#1", 0, 9)]})
    assert (res.n_nccl, res.nccl_us, res.overlap_fraction) == (0, 0, 0.0)


def test_collective_threads_splits_main_from_gloo_worker() -> None:
    trace = {"traceEvents": [
        _x("ProfilerStep#1", 0, 100, cat="user_annotation"),
        _x("c10d::allreduce_", 10, 5), _x("gloo:all_reduce", 12, 30, tid=GLOO),
        _x("gloo:all_reduce", 50, 30, tid=GLOO), _thread_name(GLOO, "thread 12 (pt_gloo_runloop)"),
    ]}  # fmt: skip
    gloo = lk.profile.collective_threads(trace, "gloo:")
    assert (gloo.on_main, gloo.on_other, gloo.other_threads) == (
        0, 2, ("thread 12 (pt_gloo_runloop)",))  # fmt: skip
    dispatch = lk.profile.collective_threads(trace, "c10d::")
    assert (dispatch.on_main, dispatch.on_other) == (1, 0)


def test_collective_threads_needs_a_recorded_step() -> None:
    with pytest.raises(ValueError, match="no ProfilerStep# events"):
        lk.profile.collective_threads({"traceEvents": [_x("gloo:all_reduce", 0, 1)]})


def _profiled_ddp(rank: int, world_size: int, trace_dir: str):
    dev = lk.get_device()
    model = lk.models.MLP(hidden=(64,), seed=0).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[dev.index] if dev.type == "cuda" else None
    )
    x = torch.randn(16, 64, device=dev)

    def step():
        ddp(x).sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    return lk.profile.profile_steps(step, trace_dir, wait=0, warmup=1, active=2,
                                    cuda=dev.type == "cuda")  # fmt: skip


def test_gloo_runs_its_collectives_off_the_training_thread(tmp_path: Path) -> None:
    profiles = lk.launch(_profiled_ddp, 2, backend="gloo", device="cpu", args=(str(tmp_path),))
    for prof in profiles:
        trace = json.loads(Path(prof.trace_path).read_text())
        gloo = lk.profile.collective_threads(trace, "gloo:")
        assert gloo.on_main == 0 and gloo.on_other >= 2, gloo  # one all-reduce per step
        assert all("gloo" in name for name in gloo.other_threads), gloo
        assert lk.profile.collective_threads(trace, "c10d::allreduce_").on_main >= 2
        assert lk.profile.nccl_overlap(trace).n_nccl == 0


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_nccl_kernels_run_on_their_own_stream(tmp_path: Path) -> None:
    profiles = lk.launch(_profiled_ddp, 2, device="cuda", args=(str(tmp_path),))
    for prof in profiles:
        res = lk.profile.nccl_overlap(json.loads(Path(prof.trace_path).read_text()))
        assert res.n_nccl >= 2, res
        assert not set(res.nccl_streams) & set(res.compute_streams), res
