"""A ``Timeline`` as Chrome-trace JSON, and a checker for that format.

Introduced in notebooks/04_custom_backend.ipynb.

The layout follows the Trace Event Format (Google, "Trace Event Format", the JSON Object
Format with complete events, ``"ph": "X"``) that Perfetto and chrome://tracing load:

- one *process* per rank (``pid`` = rank, named ``"rank r"`` by a ``process_name`` metadata
  event, ordered by ``process_sort_index``);
- three *threads* (lanes) per rank: ``tid`` 0 compute, 1 communication, 2 idle;
- ``ts`` and ``dur`` in microseconds from the timeline's origin (floats keep the ns).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from numbers import Real
from typing import Any, Protocol

from labkit.trace.spans import COMM, Span

LANES = {"compute": 0, "communication": 1, "idle": 2}
PHASES = {"X", "M", "B", "E", "i", "I", "C"}  # the ones this checker understands
_META_NAMES = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


class SpanTimeline(Protocol):
    """What a trace is drawn from: a ``lk.trace.Timeline`` (spans on one axis, idle gaps)."""

    world_size: int
    spans: Sequence[Span]
    idle: Sequence[Sequence[tuple[int, int]]]


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
        return value
    except TypeError:
        return str(value)


def to_chrome_trace(timeline: SpanTimeline, path: str | None = None) -> dict[str, Any]:
    """Chrome-trace JSON of ``timeline``: one process per rank, compute/comm/idle lanes.

    Args:
        timeline: the merged timeline (``lk.trace.Timeline.merge``).
        path: also write the JSON there (open it at https://ui.perfetto.dev).

    Returns:
        dict: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.

    Raises:
        OSError: ``path`` cannot be written.
    """
    events: list[dict[str, Any]] = []
    for rank in range(timeline.world_size):
        events.append(_meta("process_name", rank, 0, {"name": f"rank {rank}"}))
        events.append(_meta("process_sort_index", rank, 0, {"sort_index": rank}))
        for lane, tid in LANES.items():
            events.append(_meta("thread_name", rank, tid, {"name": lane}))
            events.append(_meta("thread_sort_index", rank, tid, {"sort_index": tid}))
    for s in timeline.spans:
        tid = LANES["communication"] if s.kind == COMM else LANES["compute"]
        args = {k: _jsonable(v) for k, v in s.args.items()}
        events.append(_complete(s.name, s.kind, s.start_ns, s.end_ns, s.rank, tid, args))
    for rank, gaps in enumerate(timeline.idle):
        for a, b in gaps:
            events.append(_complete("idle", "idle", a, b, rank, LANES["idle"], {}))
    trace = {"traceEvents": events, "displayTimeUnit": "ms"}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(trace, f)
    return trace


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _complete(name, cat, start_ns, end_ns, pid, tid, args) -> dict[str, Any]:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": start_ns / 1e3,
        "dur": (end_ns - start_ns) / 1e3,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _number(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _event_problems(i: int, e: Any) -> list[str]:
    if not isinstance(e, dict):
        return [f"traceEvents[{i}] is a {type(e).__name__}, not an object"]
    where = f"traceEvents[{i}] ({e.get('name')!r})"
    out = []
    for key in ("name", "ph", "pid", "tid"):
        if key not in e:
            out.append(f"{where} has no {key!r}")
    if "name" in e and not isinstance(e["name"], str):
        out.append(f"{where}: name must be a string")
    if "ph" in e and e["ph"] not in PHASES:
        out.append(f"{where}: unknown ph {e['ph']!r}")
    for key in ("pid", "tid"):
        if key in e and not (isinstance(e[key], int) and not isinstance(e[key], bool)):
            out.append(f"{where}: {key} must be an integer")
    if "args" in e and not isinstance(e["args"], dict):
        out.append(f"{where}: args must be an object")
    if e.get("ph") == "M" and e.get("name") in _META_NAMES and "args" not in e:
        out.append(f"{where}: metadata event without args")
    if e.get("ph") == "X":
        for key in ("ts", "dur"):
            if not _number(e.get(key)):
                out.append(f"{where}: ph 'X' needs a numeric {key!r} (µs)")
        if _number(e.get("dur")) and e["dur"] < 0:
            out.append(f"{where}: negative duration {e['dur']}")
        if "cat" in e and not isinstance(e["cat"], str):
            out.append(f"{where}: cat must be a string")
    return out


def check_chrome_trace(trace: Any, world_size: int | None = None) -> None:
    """Check that ``trace`` is Chrome-trace JSON Perfetto can load (and ranks are processes).

    Args:
        trace: the parsed JSON (a dict with ``traceEvents``; a bare list of events is also
            valid in the format), e.g. ``json.load(open(path))``.
        world_size: if given, every ``pid`` must be a rank in ``range(world_size)`` and every
            rank must be named ``"rank r"`` by a ``process_name`` event.

    Returns:
        None.

    Raises:
        ValueError: listing every problem found (missing keys, wrong types, unknown ``ph``,
            negative durations, pids that are not ranks, unnamed ranks, a non-JSON value).
    """
    problems: list[str] = []
    if isinstance(trace, list):
        events: Any = trace
    elif isinstance(trace, dict):
        events = trace.get("traceEvents")
        unit = trace.get("displayTimeUnit", "ms")
        if unit not in ("ms", "ns"):
            problems.append(f"displayTimeUnit must be 'ms' or 'ns', got {unit!r}")
    else:
        raise ValueError(f"a Chrome trace is an object or a list, got {type(trace).__name__}")
    if not isinstance(events, list):
        raise ValueError("a Chrome trace object needs a 'traceEvents' list")
    try:
        json.dumps(trace, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"not serialisable as strict JSON: {exc}")
    for i, e in enumerate(events):
        problems += _event_problems(i, e)
    if world_size is not None:
        pids = {e.get("pid") for e in events if isinstance(e, dict)}
        bad = sorted(p for p in pids if not (isinstance(p, int) and 0 <= p < world_size))
        if bad:
            problems.append(f"pids {bad} are not ranks of a world of {world_size}")
        named = {
            e.get("pid"): e["args"].get("name")
            for e in events
            if isinstance(e, dict)
            and e.get("ph") == "M"
            and e.get("name") == "process_name"
            and isinstance(e.get("args"), dict)
        }
        for r in range(world_size):
            if named.get(r) != f"rank {r}":
                problems.append(f"rank {r} has no process_name 'rank {r}' (got {named.get(r)!r})")
    if problems:
        raise ValueError("invalid Chrome trace:\n  " + "\n  ".join(problems))
