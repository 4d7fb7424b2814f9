"""Tests for labkit/profile: profiler traces (schema, merge, self time, spans) and speedups."""

from __future__ import annotations

import json
import math

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

import labkit as lk
from labkit.profile import SpeedupTable


def _x(name, ts, dur, tid=1, pid=7, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "cat": cat}


def _trace(*events):
    return {"traceEvents": list(events), "displayTimeUnit": "ms"}


STEP = _x("ProfilerStep#2", 100.0, 100.0, cat="user_annotation")


# --- profile_steps on one process -----------------------------------------------------------


def test_profile_steps_records_only_the_active_steps(tmp_path) -> None:
    model = torch.nn.Linear(32, 32)
    x = torch.randn(16, 32)
    calls = []

    def step():
        calls.append(1)
        model(x).sum().backward()

    prof = lk.profile.profile_steps(step, str(tmp_path), wait=1, warmup=1, active=2)
    assert len(calls) == 4 and prof.steps == 2 and len(prof.step_ms) == 2
    assert prof.rank == 0 and prof.trace_path == str(tmp_path / "rank0.json")
    trace = json.loads((tmp_path / "rank0.json").read_text())
    assert lk.profile.check_profiler_trace(trace, steps=2) > 0
    names = [r.name for r in prof.ops]
    assert "aten::addmm" in names and not any(n.startswith("ProfilerStep") for n in names)
    assert [r.self_cpu_ms for r in prof.ops] == sorted(
        (r.self_cpu_ms for r in prof.ops), reverse=True
    )
    assert sum(r.share for r in prof.ops) == pytest.approx(1.0)
    assert all(s.kind == "compute" for s in prof.spans)  # no collective on one process
    # Self time computed from the trace's events agrees with PyTorch's key_averages().
    from_trace = lk.profile.self_times(trace)
    for row in prof.top_ops(5):
        assert from_trace[row.name] == pytest.approx(row.self_cpu_ms, rel=1e-3, abs=1e-3)


def test_profile_steps_rejects_a_bad_schedule(tmp_path) -> None:
    with pytest.raises(ValueError, match="active >= 1"):
        lk.profile.profile_steps(lambda: None, str(tmp_path), active=0)


def _ddp_profile(rank, world_size, trace_dir):
    model = torch.nn.parallel.DistributedDataParallel(lk.models.MLP(hidden=(64,)))
    x = torch.randn(8, 64)

    def step():
        model(x).square().mean().backward()

    return lk.profile.profile_steps(step, trace_dir, wait=0, warmup=1, active=2)


def test_ddp_profile_on_two_ranks_merges_into_one_valid_trace(tmp_path) -> None:
    profiles = lk.launch(_ddp_profile, 2, backend="gloo", args=(str(tmp_path),), timeout=90)
    assert [p.rank for p in profiles] == [0, 1]
    traces = [json.loads(open(p.trace_path).read()) for p in profiles]
    for t in traces:
        lk.profile.check_profiler_trace(t, steps=2)
    for p in profiles:
        assert any(s.kind == "comm" and s.name.startswith(("c10d::", "gloo:")) for s in p.spans)
        assert any(r.name == "c10d::allreduce_" for r in p.ops)
    merged = lk.profile.merge_traces(traces, str(tmp_path / "all.json"))
    lk.trace.check_chrome_trace(merged, world_size=2)
    assert json.loads((tmp_path / "all.json").read_text()) == merged
    for row in lk.profile.comm_compute(profiles):
        assert row.compute_ms > 0 and row.comm_ms > 0 and 0 < row.comm_fraction <= 1
        assert row.step_ms == pytest.approx(sum(profiles[row.rank].step_ms) / 2)


# --- the trace schema -----------------------------------------------------------------------


def test_steps_on_a_gpu_stream_are_not_counted_twice() -> None:
    gpu_copy = {**STEP, "cat": "gpu_user_annotation", "pid": 0, "tid": 7}
    trace = _trace(STEP, gpu_copy, _x("aten::mm", 110, 5))
    assert lk.profile.check_profiler_trace(trace, steps=1) == 3
    assert [s.name for s in lk.profile.trace_spans(trace)] == ["aten::mm"]


def test_check_profiler_trace_accepts_torch_extras_and_counts_complete_events() -> None:
    flow = {"ph": "s", "id": 1, "name": "fwdbwd", "pid": 7, "tid": 1, "ts": 1.0, "cat": "fwdbwd"}
    pseudo = _x("PyTorch Profiler (0)", 0.0, 5.0, pid="Spans", tid="PyTorch Profiler")
    assert (
        lk.profile.check_profiler_trace(_trace(STEP, _x("aten::mm", 110, 5), flow, pseudo), 1) == 3
    )


@pytest.mark.parametrize(
    ("trace", "match"),
    [
        ([STEP], "object with a 'traceEvents' list"),
        (_trace(STEP, {**_x("aten::mm", 1, 2), "ph": "Q"}), "known 'ph'"),
        (_trace(STEP, _x("aten::mm", 1, -2)), "negative duration"),
        (_trace(STEP, {**_x("aten::mm", 1, 2), "ts": "1"}), "numeric 'ts' and 'dur'"),
        (_trace(STEP, {k: v for k, v in _x("aten::mm", 1, 2).items() if k != "tid"}), "'tid'"),
        (_trace(STEP, _x("aten::mm", 1, math.nan)), "strict JSON"),
        (_trace(_x("aten::mm", 1, 2)), "0 ProfilerStep# events, expected 1"),
    ],
    ids=["not-an-object", "unknown-ph", "negative", "string-ts", "no-tid", "nan", "no-step"],
)
def test_check_profiler_trace_names_each_problem(trace, match) -> None:
    with pytest.raises(ValueError, match=match):
        lk.profile.check_profiler_trace(trace, steps=1)


def test_merge_traces_makes_ranks_processes_and_drops_flows() -> None:
    meta = {"ph": "M", "name": "thread_name", "pid": 7, "tid": 9, "args": {"name": "gloo"}}
    flow = {"ph": "f", "id": 1, "name": "fwdbwd", "pid": 7, "tid": 1, "ts": 1.0}
    r0 = _trace(STEP, _x("aten::mm", 110, 5), _x("gloo:all_reduce", 120, 30, tid=9), meta, flow)
    r1 = _trace({**STEP, "pid": 8, "ts": 90.0}, _x("aten::mm", 95, 5, pid=8, tid=3))
    merged = lk.profile.merge_traces([r0, r1])
    lk.trace.check_chrome_trace(merged, world_size=2)
    events = merged["traceEvents"]
    assert not any(e["ph"] == "f" for e in events)
    xs = [e for e in events if e["ph"] == "X"]
    assert min(e["ts"] for e in xs) == 0.0  # rank 1's step started first, at 90 µs
    gloo = next(e for e in xs if e["name"] == "gloo:all_reduce")
    assert (gloo["pid"], gloo["tid"], gloo["ts"], gloo["dur"]) == (0, 1, 30.0, 30)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {(0, 0): "main", (0, 1): "gloo", (1, 0): "main", (1, 1): "3"}  # unnamed
    with pytest.raises(ValueError, match="at least one"):
        lk.profile.merge_traces([])
    with pytest.raises(ValueError, match="trace 1 has no 'traceEvents'"):
        lk.profile.merge_traces([r0, {}])


def test_self_times_subtract_direct_children_on_the_same_thread() -> None:
    trace = _trace(
        STEP,
        _x("parent", 100, 10),
        _x("child", 101, 3),
        _x("grandchild", 101.5, 1),
        _x("child", 105, 4),
        _x("parent", 100, 50, tid=2),  # another thread: no nesting with tid 1
    )
    got = lk.profile.self_times(trace)
    assert got == pytest.approx({"parent": 0.053, "child": 0.006, "grandchild": 0.001})
    assert list(got) == ["parent", "child", "grandchild"]  # largest first


# --- spans, compute vs communication ----------------------------------------------------------


def test_trace_spans_cut_comm_out_of_compute_and_see_overlap_on_other_threads() -> None:
    trace = _trace(
        STEP,
        _x("aten::mm", 90, 20),  # starts before the step: clipped to [100, 110]
        _x("autograd::engine::evaluate_function: X", 120, 40),
        _x("aten::add", 125, 2),  # nested: part of its parent
        _x("c10d::allreduce_", 130, 10),  # issued inside the parent on the main thread
        _x("gloo:all_reduce", 150, 30, tid=5, cat="user_annotation"),  # worker thread
        _x("aten::mul", 250, 5),  # after the step: left out
    )
    spans = lk.profile.trace_spans(trace, rank=3)
    got = [(s.name, s.kind, s.start_ns // 1000, s.end_ns // 1000) for s in spans]
    assert got == [
        ("aten::mm", "compute", 100, 110),
        ("autograd::engine::evaluate_function: X", "compute", 120, 130),
        ("c10d::allreduce_", "comm", 130, 140),
        ("autograd::engine::evaluate_function: X", "compute", 140, 160),
        ("gloo:all_reduce", "comm", 150, 180),
    ]
    assert {s.rank for s in spans} == {3}
    prof = lk.profile.RankProfile(3, "x.json", 1, (100.0 / 1e3,), (), tuple(spans))
    (row,) = lk.profile.comm_compute([prof])
    assert row.compute_ms == pytest.approx(0.040) and row.comm_ms == pytest.approx(0.040)
    assert row.overlap_ms == pytest.approx(0.010)  # gloo ran while the main thread computed
    assert row.other_ms == pytest.approx(0.030) and row.comm_fraction == pytest.approx(0.4)
    with pytest.raises(ValueError, match="no ProfilerStep"):
        lk.profile.trace_spans(_trace(_x("aten::mm", 0, 1)))
    with pytest.raises(ValueError, match="at least one"):
        lk.profile.comm_compute([])


def test_is_comm_op() -> None:
    assert all(
        map(lk.profile.is_comm_op, ["c10d::allreduce_", "gloo:all_reduce", "nccl:all_gather"])
    )
    assert not any(map(lk.profile.is_comm_op, ["aten::mm", "DistributedDataParallel.forward"]))


# --- speedups -------------------------------------------------------------------------------


TIMES = {"base": [0.10, 0.11, 0.30], "fast": [0.05, 0.06, 0.12], "slow": [0.2, 0.1, 0.4]}


def test_speedup_table_arithmetic() -> None:
    t = SpeedupTable("base", TIMES)
    assert t.median_s("base") == 0.11 and t.ratio("base") == 1.0
    assert t.ratio("fast") == pytest.approx(0.11 / 0.06)
    assert t.paired_ratios("fast") == pytest.approx([2.0, 0.11 / 0.06, 2.5])
    base, fast, slow = t.rows()
    assert (fast.wins, fast.rounds, fast.min_ratio) == (3, 3, pytest.approx(0.11 / 0.06))
    assert (slow.wins, slow.ratio) == (1, pytest.approx(0.11 / 0.2))
    assert base.wins == 0 and base.min_ratio == 1.0
    assert t.noise("base") == pytest.approx(0.01 / 0.11)  # |0.10 − 0.11|, 0, |0.30 − 0.11|
    record = t.as_record()
    assert record["fast"] == {"step_ms": 60.0, "speedup": 1.833, "rounds_won": 3, "rounds": 3}
    text = t.format({"fast": 0.05})
    assert "1.83x" in text and "3/3" in text and "1.20" in text  # measured / model
    assert text.splitlines()[1].startswith("base")


def test_slowest_rank_takes_the_max_per_round() -> None:
    a = SpeedupTable("base", {"base": [1.0, 2.0], "v": [0.5, 0.4]})
    b = SpeedupTable("base", {"base": [1.5, 1.0], "v": [0.3, 0.6]})
    merged = SpeedupTable.slowest_rank([a, b])
    assert merged.times == {"base": (1.5, 2.0), "v": (0.5, 0.6)}
    with pytest.raises(ValueError, match="differ"):
        SpeedupTable.slowest_rank([a, SpeedupTable("v", a.times)])
    with pytest.raises(ValueError, match="at least one"):
        SpeedupTable.slowest_rank([])


@pytest.mark.parametrize(
    ("baseline", "times", "match"),
    [
        ("nope", TIMES, "baseline 'nope'"),
        ("base", {"base": [1.0], "v": [1.0, 2.0]}, "same number"),
        ("base", {"base": []}, "same number"),
        ("base", {"base": [1.0, 0.0]}, "finite and > 0"),
        ("base", {"base": [1.0, math.inf]}, "finite and > 0"),
    ],
)
def test_speedup_table_rejects_bad_input(baseline, times, match) -> None:
    with pytest.raises(ValueError, match=match):
        SpeedupTable(baseline, times)


def test_measure_speedups_interleaves_rotates_and_drops_warmup() -> None:
    now = [0.0]
    order: list[str] = []
    cost = {"a": 3.0, "b": 1.0, "c": 2.0}

    def run(name):
        order.append(name)
        now[0] += cost[name]

    barriers = []
    table = lk.profile.measure_speedups(
        {n: (lambda n=n: run(n)) for n in cost},
        baseline="a",
        rounds=2,
        warmup=1,
        before=lambda: barriers.append(1),
        clock=lambda: now[0],
    )
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert len(barriers) == 9
    assert table.times == {"a": (3.0, 3.0), "b": (1.0, 1.0), "c": (2.0, 2.0)}
    assert table.ratio("b") == 3.0 and table.baseline == "a"
    assert lk.profile.measure_speedups({"x": lambda: None}, rounds=1).baseline == "x"
    with pytest.raises(ValueError, match="at least one"):
        lk.profile.measure_speedups({})
    with pytest.raises(ValueError, match="baseline 'z'"):
        lk.profile.measure_speedups({"x": lambda: None}, baseline="z")
    with pytest.raises(ValueError, match="rounds >= 1"):
        lk.profile.measure_speedups({"x": lambda: None}, rounds=0)


def test_amdahl_speedup() -> None:
    assert lk.profile.amdahl_speedup(0.5) == 2.0
    assert lk.profile.amdahl_speedup(0.5, 2.0) == pytest.approx(4 / 3)
    assert lk.profile.amdahl_speedup(0.0, 10.0) == 1.0
    assert lk.profile.amdahl_speedup(1.0) == math.inf
    with pytest.raises(ValueError, match="fraction"):
        lk.profile.amdahl_speedup(1.5)
    with pytest.raises(ValueError, match="factor"):
        lk.profile.amdahl_speedup(0.5, 0.0)


def test_speedup_bars_draws_one_bar_per_change() -> None:
    fig = lk.viz.speedup_bars(SpeedupTable("base", TIMES), title="t")
    ax = fig.axes[0]
    widths = sorted(round(p.get_width(), 3) for p in ax.patches)
    assert widths == sorted([1.0, round(0.11 / 0.06, 3), round(0.11 / 0.2, 3)])
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert dict(zip(labels, ax.get_yticks(), strict=True)) == {"base": 2, "fast": 1, "slow": 0}
    assert ax.get_title() == "t"
    FigureCanvasAgg(fig).draw()

    class Empty:
        baseline = "x"

        def rows(self):
            return []

    with pytest.raises(ValueError, match="at least one row"):
        lk.viz.speedup_bars(Empty())


# --- which activities profile_steps asks for ------------------------------------------------


class _Asked(Exception):
    pass


@pytest.mark.parametrize(
    ("device", "cuda_available", "wants_cuda"),
    [("cpu", True, False), ("cpu", False, False), ("cuda:0", True, True)],
)
def test_profile_steps_asks_for_cuda_activity_only_on_a_cuda_rank(
    tmp_path, monkeypatch, device, cuda_available, wants_cuda
) -> None:
    from torch.profiler import ProfilerActivity

    from labkit.launcher import _context

    asked = []

    def profile(activities, **kwargs):
        asked.extend(activities)
        raise _Asked

    monkeypatch.setattr(torch.profiler, "profile", profile)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_available)  # a GPU box
    monkeypatch.setattr(_context, "_current", _context.RankContext(0, 2, torch.device(device), ""))
    with pytest.raises(_Asked):
        lk.profile.profile_steps(lambda: None, str(tmp_path))
    assert asked == [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * wants_cuda


def test_profile_steps_syncs_a_cuda_rank_at_each_step_end(tmp_path, monkeypatch) -> None:
    from labkit.launcher import _context

    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    gpu = torch.device("cuda:1")
    monkeypatch.setattr(_context, "_current", _context.RankContext(1, 2, gpu, ""))
    # cuda=False: a CPU-only profile of a CUDA rank (this CPU build has no CUDA profiler);
    # its step times still cover the kernels.
    lk.profile.profile_steps(lambda: calls.append("step"), str(tmp_path), cuda=False)
    assert calls == ["step", gpu] * 5
    calls.clear()

    class Profile:  # records the order of step ends, stands in for the CUDA profiler
        def __init__(self, **kwargs):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def step(self):
            calls.append("step end")

        def export_chrome_trace(self, path):
            raise _Asked

    monkeypatch.setattr(torch.profiler, "profile", Profile)
    with pytest.raises(_Asked):
        lk.profile.profile_steps(lambda: calls.append("step"), str(tmp_path), wait=0, active=1)
    assert calls == ["step", gpu, "step end"] * 2
