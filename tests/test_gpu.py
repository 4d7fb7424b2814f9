"""The device rule on real GPUs: what the CPU tests of test_device_rule.py mock.

Marked ``gpu``: each skips itself without the GPUs it needs; ``make gpu-check`` runs them.
"""

from __future__ import annotations

import pytest
import torch

import labkit as lk

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def _where(rank, world_size):
    import torch
    import torch.distributed as dist

    x = torch.full((1 << 16,), float(rank + 1), device=lk.get_device())
    dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize()
    return dist.get_backend(), lk.device_backend(), str(lk.get_device()), x[0].item()


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_one_rank_per_gpu_runs_on_nccl():
    out = lk.launch(_where, GPUS)
    assert [o[2] for o in out] == [f"cuda:{r}" for r in range(GPUS)]
    assert {o[1] for o in out} == {"nccl"}
    assert {o[3] for o in out} == {GPUS * (GPUS + 1) / 2}


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_more_ranks_than_gpus_run_on_the_cpu_and_say_so(capfd):
    out = lk.launch(_where, GPUS + 1)
    assert {o[:3] for o in out} == {("gloo", "gloo", "cpu")}
    assert "NCCL needs one GPU per rank" in capfd.readouterr().err
    with pytest.raises(RuntimeError, match=f"needs {GPUS + 1} GPUs"):
        lk.launch(_where, GPUS + 1, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_fit_ranks_on_this_machine(capfd):
    assert lk.fit_ranks(GPUS, "nccl", "cuda") == (GPUS, "nccl", "cuda")
    assert lk.fit_ranks(GPUS + 1, "nccl", "cuda") == (GPUS + 1, "gloo", "cpu")


@pytest.mark.gpu
@pytest.mark.skipif(GPUS < 1, reason="needs a CUDA GPU")
def test_bench_times_cuda_work_to_its_end():
    """A p2p ping-pong on GPUs takes at least the copy time of its bytes (synchronized)."""
    if GPUS < 2:
        pytest.skip("needs 2 GPUs")

    def pingpong(rank, world_size):
        return lk.bench.p2p_pingpong([1 << 24], iters=5, warmup=2)

    rows = lk.launch(pingpong, 2)[0]
    assert rows[0].time_min_s > (1 << 24) / 2e12  # slower than 2 TB/s: the copy was waited for
