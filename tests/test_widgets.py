"""The explorers' callbacks, headless: their numbers are labkit's; controls call them."""

from __future__ import annotations

import pytest
import torch
from matplotlib.figure import Figure

import labkit as lk
from labkit import memory
from labkit.bench import BenchResult
from labkit.collectives.ring_trace import trace_ring_allreduce
from labkit.costmodel import ALGORITHMS, PRESETS, Network, predict

widgets = pytest.importorskip("ipywidgets")


# ring stepper


@pytest.mark.parametrize(("p", "n"), [(2, 3), (4, 8), (5, 7)])
def test_ring_stepper_walks_the_real_trace(p, n):
    stepper = lk.widgets.RingStepper(world_size=p, n_elements=n, seed=1)
    assert stepper.n_frames == 2 * (p - 1) + 1
    gen = torch.Generator().manual_seed(1)
    x = torch.randint(0, 10, (p, n), generator=gen).float()
    reference = trace_ring_allreduce(x)
    assert stepper.trace.inputs == x.tolist()
    assert stepper.show(0) is None
    for frame in range(1, stepper.n_frames):
        step = stepper.show(frame)
        assert stepper.frame == frame and isinstance(stepper.figure, Figure)
        assert step.after == reference.steps[frame - 1].after
        assert step.transfers == reference.steps[frame - 1].transfers
        assert f"{step.phase} step {step.step + 1}/{p - 1}" in stepper.text
    final = stepper.trace.steps[-1].after
    assert all(row == x.sum(0).tolist() for row in final)
    assert "every rank now holds the sum" in stepper.text


def test_ring_stepper_rejects_bad_values():
    stepper = lk.widgets.RingStepper(world_size=3, n_elements=4)
    with pytest.raises(ValueError, match="frame"):
        stepper.show(5)
    with pytest.raises(ValueError, match="world_size"):
        stepper.configure(0, 4)
    with pytest.raises(ValueError, match="n_elements"):
        stepper.configure(3, 0)


def test_ring_stepper_controls_call_the_callback():
    box = lk.widgets.ring_stepper(world_size=3, n_elements=6)
    assert isinstance(box, widgets.VBox)
    stepper = box.explorer
    stepper._slider.value = 3
    assert stepper.frame == 3 and stepper.text.startswith("all-gather step 1/2")
    stepper.configure(4, 5)
    assert stepper._slider.max == 6 and stepper.frame == 0


def test_importing_labkit_does_not_import_ipywidgets():
    import subprocess
    import sys

    code = "import sys, labkit; labkit.memory; print('ipywidgets' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# cost explorer


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("algorithm", list(ALGORITHMS["all_reduce"]))
def test_cost_explorer_number_is_the_cost_model(preset, algorithm):
    net = Network.preset(preset)
    explorer = lk.widgets.CostExplorer(net, world_size=16, n_bytes=1 << 22, algorithm=algorithm)
    assert explorer.predicted_s == predict("all_reduce", 1 << 22, 16, net, algorithm)
    got = explorer.update(2.5, 40.0, 64, 4096, algorithm)
    assert got == predict("all_reduce", 4096, 64, Network(2.5, 40.0), algorithm)
    assert f"{got * 1e6:,.1f} µs" in explorer.text


def test_cost_explorer_other_collectives_and_errors():
    explorer = lk.widgets.CostExplorer("100Gb-IB")
    t = explorer.update(1.0, 12.5, 8, 1 << 20, "bruck", collective="all_to_all")
    assert t == predict("all_to_all", 1 << 20, 8, Network(1.0, 12.5), "bruck")
    with pytest.raises(ValueError, match="algorithm"):
        explorer.update(1.0, 12.5, 8, 1 << 20, "ring", collective="all_to_all")
    with pytest.raises(ValueError, match="preset"):
        lk.widgets.CostExplorer("carrier pigeon")


def _row(n_bytes: int, time_s: float, p: int = 4, op: str = "all_reduce") -> BenchResult:
    return BenchResult(op, n_bytes, time_s, n_bytes / time_s / 1e9, 0.0, p, "gloo", "cpu", 5)


def test_cost_explorer_draws_measured_points():
    rows = [_row(1024, 2e-3), _row(1 << 20, 9e-3), _row(4096, 1e-3, op="broadcast")]
    rows.append(_row(1 << 16, 4e-3).as_dict())  # plain dicts work too
    explorer = lk.widgets.CostExplorer("loopback", world_size=4, measured=rows)
    ax = explorer.figure.axes[0]
    points = [line for line in ax.get_lines() if line.get_marker() == "x"]
    assert len(points) == 1  # one world size; the broadcast row is not all_reduce
    assert list(points[0].get_xdata()) == [1024, 1 << 16, 1 << 20]
    assert list(points[0].get_ydata()) == [2e-3, 4e-3, 9e-3]


def test_cost_explorer_controls_call_the_callback():
    box = lk.widgets.cost_explorer("10GbE", world_size=8, n_bytes=1 << 20)
    explorer = box.explorer
    preset = box.children[0].children[0]
    preset.value = "NVLink"
    nvlink = PRESETS["NVLink"]
    assert explorer.network.latency_us == pytest.approx(nvlink.latency_us)
    assert explorer.predicted_s == pytest.approx(
        predict("all_reduce", 1 << 20, 8, nvlink, "ring"), rel=1e-9
    )
    algo = box.children[1].children[1]
    algo.value = "tree"
    assert explorer.algorithm == "tree"


# ZeRO memory explorer


@pytest.mark.parametrize("stage", memory.STAGES)
@pytest.mark.parametrize(("psi", "nd"), [(7.5e9, 64), (1e12, 1024), (1.5e9, 1)])
def test_zero_explorer_numbers_are_the_memory_model(stage, psi, nd):
    explorer = lk.widgets.ZeroMemoryExplorer(psi, nd, stage)
    assert explorer.breakdown == memory.zero_memory(psi, nd, stage)
    assert explorer.breakdowns == [memory.zero_memory(psi, nd, s) for s in memory.STAGES]
    assert f"{explorer.breakdown.total_gb:,.4g} GB per device" in explorer.text


def test_zero_explorer_worked_example_text_and_bars():
    explorer = lk.widgets.ZeroMemoryExplorer(7.5e9, 64, 1)
    assert "31.41 GB per device (fits)" in explorer.text
    totals = [t.get_text() for t in explorer.figure.axes[0].texts]
    assert totals == ["120 GB", "31.4 GB", "16.6 GB", "1.88 GB"]
    explorer.update(7.5e9, 4, 0)
    assert "(does not fit)" in explorer.text


def test_zero_explorer_controls_call_the_callback():
    box = lk.widgets.zero_memory_explorer(7.5e9, 64, 3)
    explorer = box.explorer
    size, dp, stage = box.children[:3]
    stage.value = 2
    dp.value = 16
    assert explorer.breakdown == memory.zero_memory(7.5e9, 16, 2)
    size.value = 1e11
    assert explorer.n_params == pytest.approx(1e11)
    assert explorer.breakdown.total_bytes == pytest.approx(memory.per_device_bytes(1e11, 16, 2))


# pipeline schedule explorer


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved_1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (3, 6)])
def test_pipeline_explorer_is_the_schedule_library(name, p, m):
    from labkit.parallel import pipeline as pp

    explorer = lk.widgets.PipelineExplorer(p, m, name, n_virtual=2)
    v = 2 if name == "interleaved_1f1b" else 1
    expected = {
        "gpipe": lambda: pp.gpipe(p, m),
        "1f1b": lambda: pp.one_f_one_b(p, m),
        "interleaved_1f1b": lambda: pp.interleaved_one_f_one_b(p, m, 2),
    }[name]()
    state = explorer.state
    assert state["schedule"] == expected
    assert state["bubble"] == pp.bubble_fraction(expected)
    assert state["bubble"] == pytest.approx((p - 1) / (v * m + p - 1))  # B = F slots
    assert state["bubble_theory"] == pp.bubble_fraction_theory(p, m, v)
    assert state["peak_in_flight"] == pp.peak_in_flight(expected)
    assert f"bubble {state['bubble']:.1%}" in explorer.text
    assert isinstance(explorer.figure, Figure)


def test_pipeline_explorer_errors_and_controls():
    with pytest.raises(ValueError, match="multiple"):
        lk.widgets.PipelineExplorer(4, 6, "interleaved_1f1b")
    with pytest.raises(ValueError, match="unknown schedule"):
        lk.widgets.PipelineExplorer(4, 8, "zero_bubble")
    box = lk.widgets.pipeline_explorer(4, 8, "gpipe")
    explorer = box.explorer
    name, sizes = box.children[:2]
    name.value = "1f1b"
    assert explorer.schedule_name == "1f1b"
    assert explorer.state["peak_in_flight"] == {0: 4, 1: 3, 2: 2, 3: 1}  # p − stage
    name.value = "interleaved_1f1b"
    sizes.children[1].value = 6  # not a multiple of 4: reported, not raised
    assert explorer.text.startswith("cannot build this schedule") and explorer.figure is None
    sizes.children[1].value = 12
    assert explorer.n_microbatches == 12 and explorer.state["bubble"] == pytest.approx(
        3 / (2 * 12 + 3)
    )
