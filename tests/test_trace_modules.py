"""Tests for labkit/trace/modules.py: one forward and one backward span per traced layer."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import labkit as lk


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Sequential(nn.Linear(4, 8), lk.models.ComputeDelay(backward_ms=20)),
        nn.ReLU(),
        nn.Sequential(nn.Linear(8, 2), lk.models.ComputeDelay(backward_ms=10)),
    )


def test_spans_per_layer_in_forward_then_reverse_order() -> None:
    model = _model()
    lk.trace.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # module full-backward hooks would warn on layer 0
        with lk.trace.trace_modules(model) as tracer:
            model(torch.randn(3, 4)).sum().backward()
    assert tracer.names == ["0", "1", "2"]
    spans = lk.trace.events()
    assert [s.name for s in spans] == ["fwd 0", "fwd 1", "fwd 2", "bwd 2", "bwd 1", "bwd 0"]
    assert all(s.kind == "compute" for s in spans)
    by_name = {s.name: s for s in spans}
    # the first layer (input needs no gradient) still covers its backward: its 20 ms delay
    assert by_name["bwd 0"].duration_ns >= 20e6
    assert by_name["bwd 2"].duration_ns >= 10e6
    # layer 2's input is layer 1's output: one gradient ends one span and starts the next
    assert by_name["bwd 2"].start_ns < by_name["bwd 1"].start_ns < by_name["bwd 0"].start_ns
    assert by_name["bwd 2"].end_ns <= by_name["bwd 0"].start_ns


def test_remove_takes_every_hook_off() -> None:
    model = _model()
    with lk.trace.trace_modules(model, names=["0.0", "2"]) as tracer:
        model(torch.randn(3, 4)).sum().backward()
    assert tracer.names == ["0.0", "2"]
    lk.trace.reset()
    model(torch.randn(3, 4)).sum().backward()  # no hooks left: nothing recorded
    assert lk.trace.events() == []
    assert all(not p._backward_hooks for p in model.parameters())


def test_no_grad_forward_records_no_backward() -> None:
    model = _model()
    lk.trace.reset()
    with lk.trace.trace_modules(model), torch.no_grad():
        model(torch.randn(3, 4))
    assert [s.name for s in lk.trace.events()] == ["fwd 0", "fwd 1", "fwd 2"]


def test_bad_names_are_rejected() -> None:
    with pytest.raises(ValueError, match=r"no submodules named \['nope'\]"):
        lk.trace.trace_modules(_model(), names=["nope"])
    with pytest.raises(ValueError, match="no children"):
        lk.trace.trace_modules(nn.Linear(2, 2))
