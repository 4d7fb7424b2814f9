"""Tests for labkit/costmodel/ddp.py: a bucketed backward on one link, PowerSGD's sizes."""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.costmodel import Network, bucketed_backward_s, powersgd_numel, predict

NET = Network(latency_us=100.0, bandwidth_gbps=0.1, name="slow")  # 1 MB ring on 4: 15.6 ms


def test_overlap_hides_all_but_the_last_bucket_when_the_link_keeps_up() -> None:
    t1 = predict("all_reduce", 1e6, 4, NET)
    ready = [t1 * (k + 1) for k in range(4)]  # a bucket every t1: the link is never queued
    assert bucketed_backward_s(ready, [1e6] * 4, 4, NET) == pytest.approx(5 * t1)
    # without overlap everything waits for the end of backward, then queues: 4 + 4
    assert bucketed_backward_s(ready, [1e6] * 4, 4, NET, overlap=False) == pytest.approx(8 * t1)


def test_a_slow_link_queues_buckets_and_sets_the_pace() -> None:
    t1 = predict("all_reduce", 1e6, 2, NET)
    ready = [0.0, 0.0, 0.0]  # all ready at once: one after another on the link
    assert bucketed_backward_s(ready, [1e6] * 3, 2, NET) == pytest.approx(3 * t1)
    assert bucketed_backward_s([], [], 2, NET, backward_s=0.5) == 0.5
    # a long backward after the last bucket: it ends when backward ends
    assert bucketed_backward_s([0.0], [1e6], 2, NET, backward_s=1.0) == pytest.approx(1.0)
    assert bucketed_backward_s([0.0], [1e6], 2, NET, overlap=False, backward_s=1.0) == (
        pytest.approx(1.0 + t1)
    )


def test_one_bucket_gets_no_overlap() -> None:
    ready = [0.2]
    assert bucketed_backward_s(ready, [4e6], 4, NET) == bucketed_backward_s(
        ready, [4e6], 4, NET, overlap=False
    )


def test_bucketed_backward_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="2 ready times for 1 buckets"):
        bucketed_backward_s([0.0, 1.0], [1.0], 2, NET)
    with pytest.raises(ValueError, match=">= 0"):
        bucketed_backward_s([-1.0], [1.0], 2, NET)
    with pytest.raises(ValueError, match="before a bucket is ready"):
        bucketed_backward_s([1.0], [1.0], 2, NET, backward_s=0.5)


def test_powersgd_numel_closed_form() -> None:
    # 128×64 at rank 2: 2·(128+64) = 384 instead of 8192; a bias is sent whole
    assert powersgd_numel([(128, 64), (128,)], 2) == (384 + 128, 8192 + 128)
    # 10×64 at rank 4: 4·74 = 296, 296·2 = 592 < 640: compressed; rank 5: 370·2 > 640: not
    assert powersgd_numel([(10, 64)], 4) == (296, 640)
    assert powersgd_numel([(10, 64)], 5) == (640, 640)
    assert powersgd_numel([(10, 64)], 5, min_compression_rate=1.0) == (370, 640)
    # a conv kernel is viewed as out_channels × the rest: 16 × 72
    assert powersgd_numel([(16, 8, 3, 3)], 1) == (16 + 72, 16 * 72)
    with pytest.raises(ValueError, match="rank must be >= 1"):
        powersgd_numel([(4, 4)], 0)


def _powersgd_bytes(rank: int, world_size: int, approx_rank: int) -> tuple[list, list]:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    from labkit.backends import recording

    model = lk.models.MLP(seed=0)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = psgd.PowerSGDState(None, matrix_approximation_rank=approx_rank, start_powerSGD_iter=2)
    ddp.register_comm_hook(state, psgd.powerSGD_hook)
    for _ in range(4):  # steps 0-1 plain all-reduce, then PowerSGD
        recording.clear()
        ddp(torch.randn(8, 64)).square().mean().backward()
        ddp.zero_grad()
    ops = [(r.op, r.n_bytes) for r in recording.records()]
    return ops, [tuple(p.shape) for p in model.parameters()]


@pytest.mark.parametrize("approx_rank", [1, 4])
def test_powersgd_numel_is_what_torchs_hook_all_reduces(approx_rank: int) -> None:
    (ops, shapes), _ = lk.launch(
        _powersgd_bytes, 2, backend="labkit_record", args=(approx_rank,), timeout=60
    )
    assert {op for op, _ in ops} == {"all_reduce"}
    sent, dense = powersgd_numel(shapes, approx_rank)
    assert sum(n for _, n in ops) == 4 * sent
    assert dense == lk.models.count_parameters(lk.models.MLP(seed=0))
