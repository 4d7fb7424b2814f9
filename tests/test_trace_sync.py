"""Tests for labkit/trace/spans.py's ``sync_device`` and ``span(device=...)``: a host timer
synchronises CUDA exactly when the work is on a GPU (``torch.cuda`` mocked on this CPU box)."""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit import bench_collectives, profile
from labkit.collectives import timing
from labkit.parallel.pipeline import runtime
from labkit.trace import spans


@pytest.fixture
def syncs(monkeypatch) -> list:
    """Every ``torch.cuda.synchronize`` call, in order, interleaved with the clock's reads."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    real = spans.clock_ns
    monkeypatch.setattr(spans, "clock_ns", lambda: calls.append("clock") or real())
    return calls


@pytest.mark.parametrize("device", [None, "cpu", torch.device("cpu"), torch.device("meta")])
def test_no_sync_off_the_gpu(syncs, device) -> None:
    lk.trace.sync_device(device)
    with lk.trace.span("forward", device=device):
        pass
    assert syncs == ["clock", "clock"]


@pytest.mark.parametrize("device", [torch.device("cuda:1"), torch.device("cuda"), "cuda:0"])
def test_one_sync_per_call_on_a_gpu(syncs, device) -> None:
    lk.trace.sync_device(device)
    assert syncs == [device]


def test_a_gpu_span_syncs_before_each_clock_read(syncs) -> None:
    lk.trace.reset()
    syncs.clear()  # reset() read the clock
    gpu = torch.device("cuda:0")
    with lk.trace.span("1F0", device=gpu, stage=1):
        syncs.append("kernels queued")
    assert syncs == [gpu, "clock", "kernels queued", gpu, "clock"]
    (s,) = lk.trace.events()
    assert s.args == {"stage": 1}  # the device is not a span argument


def test_a_span_without_a_device_never_syncs(syncs) -> None:
    with lk.trace.span("forward"):
        pass
    assert syncs == ["clock", "clock"]


def test_the_timers_share_the_one_helper() -> None:
    # bench (p2p and collectives), collective timing, the pipeline's spans and the profiler
    # all synchronise through labkit.trace.sync_device, not copies of it.
    for module in (lk.bench, bench_collectives, timing, profile.profiler):
        assert module.sync_device is lk.trace.sync_device, module
    assert runtime.span is lk.trace.span
