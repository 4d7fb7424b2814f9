"""Tests for labkit/trace: spans, the merged timeline's idle gaps, Chrome-trace JSON, the figure."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from matplotlib.figure import Figure

import labkit as lk
from labkit.trace import Span, Timeline, check_chrome_trace

MS = 1_000_000  # ns


def _s(name: str, a_ms: float, b_ms: float, kind: str = "compute", rank: int = 0) -> Span:
    return Span(name, kind, int(a_ms * MS), int(b_ms * MS), rank)


@pytest.fixture
def synthetic() -> Timeline:
    """Two ranks on clocks 1000 ms apart in absolute value (only differences matter).

    rank 0: compute 0–4, comm 3–6 (overlapping), gap 6–8, compute 8–10  → idle 2 ms (6–8)
    rank 1: compute 1–2, gap 2–5, comm 5–7 (ends early, the timeline ends at 10)
            → idle 0–1, 2–5, 7–10 = 7 ms
    """
    base = 1000.0
    r0 = [
        _s("forward", base + 0, base + 4),
        _s("all_reduce", base + 3, base + 6, "comm"),
        _s("step", base + 8, base + 10),
    ]
    r1 = [_s("forward", base + 1, base + 2), _s("all_reduce", base + 5, base + 7, "comm")]
    return Timeline.merge([r0, r1])


def test_merge_aligns_to_the_first_span_and_finds_known_gaps(synthetic: Timeline) -> None:
    assert synthetic.world_size == 2
    assert synthetic.origin_ns == 1000 * MS
    assert synthetic.end_ns == 10 * MS
    assert synthetic.idle[0] == [(6 * MS, 8 * MS)]
    assert synthetic.idle[1] == [(0, 1 * MS), (2 * MS, 5 * MS), (7 * MS, 10 * MS)]
    assert [s.rank for s in synthetic.of_rank(1)] == [1, 1]


def test_summary_splits_time_into_compute_comm_overlap_idle(synthetic: Timeline) -> None:
    r0, r1 = synthetic.summary()
    assert r0.compute_s == pytest.approx(6e-3)
    assert r0.comm_s == pytest.approx(3e-3)
    assert r0.overlap_s == pytest.approx(1e-3)  # 3–4 ms
    assert r0.idle_s == pytest.approx(2e-3)
    assert r1.idle_s == pytest.approx(7e-3)
    for r in (r0, r1):
        assert r.compute_s + r.comm_s - r.overlap_s + r.idle_s == pytest.approx(r.total_s)


def test_offsets_shift_each_ranks_clock() -> None:
    tl = Timeline.merge([[_s("a", 0, 1)], [_s("b", 5, 6)]], offsets_ns=[0, 5 * MS])
    assert [(s.start_ns, s.end_ns) for s in tl.spans] == [(0, MS), (0, MS)]
    assert tl.idle == [[], []]


def test_merge_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        Timeline.merge([])
    with pytest.raises(ValueError, match="ends before it starts"):
        Timeline.merge([[Span("x", "compute", 10, 5)]])
    with pytest.raises(ValueError, match="2 offsets for 1 ranks"):
        Timeline.merge([[]], offsets_ns=[0, 0])


def test_a_rank_with_no_spans_is_idle_throughout() -> None:
    tl = Timeline.merge([[_s("a", 0, 3)], []])
    assert tl.idle[1] == [(0, 3 * MS)]


def test_chrome_trace_matches_the_format(synthetic: Timeline, tmp_path) -> None:
    path = tmp_path / "trace.json"
    trace = synthetic.to_chrome_trace(str(path))
    loaded = json.loads(path.read_text())  # what Perfetto's JSON importer reads
    assert loaded == trace
    assert loaded["displayTimeUnit"] == "ms"
    check_chrome_trace(loaded, world_size=2)
    complete = [e for e in loaded["traceEvents"] if e["ph"] == "X"]
    for e in complete:
        assert {"name", "cat", "ph", "ts", "dur", "pid", "tid", "args"} <= set(e)
        assert isinstance(e["ts"], float) and isinstance(e["dur"], float) and e["dur"] >= 0
        assert e["pid"] in (0, 1) and e["tid"] in (0, 1, 2)
    lanes = {(e["cat"], e["tid"]) for e in complete}
    assert lanes == {("compute", 0), ("comm", 1), ("idle", 2)}
    # 5 spans + 1 + 3 idle gaps; ts/dur in µs
    assert len(complete) == 9
    comm0 = next(e for e in complete if e["cat"] == "comm" and e["pid"] == 0)
    assert (comm0["ts"], comm0["dur"]) == (3000.0, 3000.0)
    names = {
        e["pid"]: e["args"]["name"] for e in loaded["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {0: "rank 0", 1: "rank 1"}


def test_chrome_trace_order_does_not_matter(synthetic: Timeline) -> None:
    trace = synthetic.to_chrome_trace()
    trace["traceEvents"].reverse()
    check_chrome_trace(trace, world_size=2)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.pop("ts"), "numeric 'ts'"),
        (lambda e: e.update(dur=-1.0), "negative duration"),
        (lambda e: e.update(ph="Z"), "unknown ph"),
        (lambda e: e.update(pid=7), "pids \\[7\\]"),
        (lambda e: e.update(tid="lane"), "tid must be an integer"),
        (lambda e: e.update(name=3), "name must be a string"),
        (lambda e: e.update(ts=float("nan")), "strict JSON"),
    ],
)
def test_checker_catches_broken_traces(synthetic: Timeline, mutate, message: str) -> None:
    trace = synthetic.to_chrome_trace()
    mutate(next(e for e in trace["traceEvents"] if e["ph"] == "X"))
    with pytest.raises(ValueError, match=message):
        check_chrome_trace(trace, world_size=2)


def test_checker_wants_named_ranks_and_a_list(synthetic: Timeline) -> None:
    trace = synthetic.to_chrome_trace()
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["name"] != "process_name"]
    with pytest.raises(ValueError, match="rank 0 has no process_name"):
        check_chrome_trace(trace, world_size=2)
    with pytest.raises(ValueError, match="traceEvents"):
        check_chrome_trace({"events": []})
    check_chrome_trace([])  # the bare-array form is valid too


def test_span_records_time_kind_and_args() -> None:
    lk.trace.reset()
    with lk.trace.span("forward", layer=3):
        sum(range(1000))
    with pytest.raises(KeyError), lk.trace.span("fails", kind="data"):
        raise KeyError("still recorded")
    a, b = lk.trace.events()
    assert (a.name, a.kind, a.args) == ("forward", "compute", {"layer": 3})
    assert 0 < a.duration_ns and a.end_ns <= b.start_ns
    assert (b.name, b.kind) == ("fails", "data")
    lk.trace.reset()
    assert lk.trace.events() == []
    with pytest.raises(ValueError, match="needs a name"):
        with lk.trace.span(""):
            pass


def _traced_step(rank: int, world_size: int) -> list[Span]:
    t = torch.ones(1000)
    dist.all_reduce(t)  # before reset: left out
    lk.trace.reset()
    with lk.trace.span("forward"):
        t = t * 2
    dist.all_reduce(t)
    dist.barrier()
    return lk.trace.events()


def test_events_include_the_recording_backends_ops_on_one_clock() -> None:
    per_rank = lk.launch(
        _traced_step, world_size=2, backend=lk.backends.recording.spec("gloo"), timeout=60
    )
    for rank, events in enumerate(per_rank):
        assert [(s.name, s.kind) for s in events] == [
            ("forward", "compute"),
            ("all_reduce", "comm"),
            ("barrier", "comm"),
        ]
        assert all(s.rank == rank for s in events)
        assert events[1].args["n_bytes"] == 4000 and events[1].args["participants"] == [0, 1]
    tl = Timeline.merge(per_rank)
    barriers = [s for s in tl.spans if s.name == "barrier"]
    assert all(b.end_ns >= max(x.start_ns for x in barriers) for b in barriers)
    check_chrome_trace(tl.to_chrome_trace(), world_size=2)


def test_viz_timeline_draws_one_lane_per_rank(synthetic: Timeline) -> None:
    fig = lk.viz.timeline(synthetic, title="step")
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1"]
    assert ax.get_title() == "step"
    # one bar collection per rank's idle gaps plus one per span
    assert len(ax.collections) == 2 + len(synthetic.spans)
    with pytest.raises(ValueError, match="no ranks"):
        lk.viz.timeline(Timeline([], 0, 0, []))
