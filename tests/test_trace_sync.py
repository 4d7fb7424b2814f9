"""Tests for labkit/trace/spans.py's ``sync_device`` and ``span(device=...)``: a host timer
synchronises CUDA exactly when the work is on a GPU (``torch.cuda`` mocked on this CPU box)."""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit import bench_collectives, bench_compute, bench_p2p, profile
from labkit.capstone import train as capstone_train
from labkit.collectives import timing
from labkit.parallel.compose import step as compose_step
from labkit.parallel.model_split import runtime as model_split_runtime
from labkit.parallel.pipeline import runtime
from labkit.scripts import train_model_split
from labkit.trace import spans


@pytest.fixture
def syncs(monkeypatch) -> list:
    """Every ``torch.cuda.synchronize`` call, in order, interleaved with the clock's reads."""
    calls: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))

    class Stream:  # the current stream of a device
        def __init__(self, device):
            self.device = device

        def synchronize(self):
            calls.append(("stream", self.device))

    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
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


def test_a_gpu_span_syncs_its_current_stream_before_each_clock_read(syncs) -> None:
    lk.trace.reset()
    syncs.clear()  # reset() read the clock
    gpu = torch.device("cuda:0")
    with lk.trace.span("1F0", device=gpu, stage=1):
        syncs.append("kernels queued")
    # The current stream only: NCCL's stream keeps running, so overlap stays visible.
    stream = ("stream", gpu)
    assert syncs == [stream, "clock", "kernels queued", stream, "clock"]
    (s,) = lk.trace.events()
    assert s.args == {"stage": 1}  # the device is not a span argument


def test_a_span_without_a_device_never_syncs(syncs) -> None:
    with lk.trace.span("forward"):
        pass
    assert syncs == ["clock", "clock"]


def test_traced_modules_sync_the_device_of_their_parameters(syncs) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    tracer = lk.trace.trace_modules(model)
    assert tracer.device == torch.device("cpu")
    tracer.device = torch.device("cuda:2")  # as if the model lived on GPU 2
    model(torch.ones(1, 2)).sum().backward()
    tracer.remove()
    assert [c for c in syncs if c != "clock"] == [("stream", torch.device("cuda:2"))] * 4


def test_the_timers_share_the_one_helper() -> None:
    # bench (p2p, collectives, peak FLOP/s), collective timing, the composed step's timer, the
    # pipeline's spans and the profiler all synchronise through labkit.trace.sync_device.
    modules = (bench_p2p, bench_collectives, bench_compute, timing, profile.profiler)
    modules = (*modules, profile.speedup, compose_step)
    for module in (*modules, capstone_train, train_model_split):
        assert module.sync_device is lk.trace.sync_device, module
    assert runtime.span is lk.trace.span is model_split_runtime.span


def test_measure_speedups_times_from_a_synced_gpu_to_a_synced_gpu(syncs) -> None:
    gpu = torch.device("cuda:0")
    ticks = iter(range(100))
    table = lk.profile.measure_speedups(
        {"a": lambda: syncs.append("a")}, rounds=2, warmup=0, clock=lambda: next(ticks), device=gpu
    )
    assert syncs == [gpu, "a", gpu] * 2
    assert table.baseline == "a"
