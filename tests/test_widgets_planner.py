"""The planner explorer and its figure, headless: their numbers are ``labkit.planner.plan``'s."""

from __future__ import annotations

import pytest
from matplotlib.figure import Figure

import labkit as lk
from labkit.costmodel import Network
from labkit.planner import DeviceSpec, ModelSpec, plan

widgets = pytest.importorskip("ipywidgets")

MODEL = ModelSpec(n_params=10**9, n_layers=16, hidden=2048, seq_len=1024, batch=32, n_heads=16)
DEVICES = DeviceSpec(8, 40e9, 1e14)


def test_explorer_shows_the_planner():
    ex = lk.widgets.PlannerExplorer(MODEL, DEVICES, "NVLink", mixed_precision=True, top=5)
    want = plan(MODEL, DEVICES, Network.preset("NVLink"), mixed_precision=True)
    assert [p.label for p in ex.plans] == [p.label for p in want]
    assert ex.best.label == want[0].label and want[0].feasible
    assert want[0].label in ex.text and want[0].reasons[0] in ex.text
    n_ok = sum(p.feasible for p in want)
    assert f"{n_ok} of {len(want)} plans fit" in ex.text
    assert isinstance(ex.figure, Figure)
    # a smaller device: fewer plans fit, and none when nothing can
    fewer = ex.update(10**9, 8, 10.0, "NVLink")
    assert sum(p.feasible for p in fewer) < n_ok
    assert ex.update(10**12, 8, 1.0, Network.preset("10GbE"))[0].feasible is False
    assert ex.best is None and "0 of" in ex.text


def test_explorer_controls_call_the_callback():
    box = lk.widgets.planner_explorer(MODEL, DEVICES, "100Gb-IB")
    assert isinstance(box, widgets.VBox)
    ex = box.explorer
    size, count, memory, net, mixed = box.children[:5]
    count.value = 4
    assert ex.devices.count == 4 and all(p.dp * p.pp * p.tp == 4 for p in ex.plans)
    net.value = Network.preset("NVLink")
    assert ex.network.name == "NVLink"
    mixed.value = False
    assert ex.mixed_precision is False
    with pytest.raises(ValueError, match="unknown network preset"):
        ex.update(10**9, 8, 80.0, "carrier pigeon")


def test_plan_breakdown_figure():
    plans = plan(MODEL, DEVICES, Network.preset("NVLink"))
    fig = lk.viz.plan_breakdown(plans, DEVICES.memory_bytes, top=6)
    ax_t, ax_m = fig.axes
    labels = [t.get_text() for t in ax_t.get_yticklabels()]
    assert labels[0].startswith(plans[0].label) and len(labels) == 6
    n = len(labels)  # bars are drawn part by part, each part for every plan in order
    step = sum(ax_t.patches[k * n].get_width() for k in range(len(ax_t.patches) // n))
    assert step == pytest.approx(plans[0].step_s)
    memory = sum(ax_m.patches[k * n].get_width() for k in range(len(ax_m.patches) // n))
    assert memory == pytest.approx(plans[0].memory_bytes / 1e9)
    with pytest.raises(ValueError, match="top"):
        lk.viz.plan_breakdown(plans, top=0)
    broken = [p for p in plans if p.step_s != p.step_s]
    if broken:
        with pytest.raises(ValueError, match="at least one plan"):
            lk.viz.plan_breakdown(broken)
