"""torch.profiler's Chrome-trace files: check one, merge every rank's, self time from events.

Introduced in notebooks/20_performance_tuning.ipynb.

A file from ``prof.export_chrome_trace`` follows the Trace Event Format (Google, "Trace
Event Format": ``traceEvents`` with ``ph``, ``ts`` and ``dur`` in µs, ``pid``/``tid``) with
torch's additions: flow events (``ph`` ``s``/``f``) tying forward ops to their backward, and
pseudo-processes named by strings (``"Spans"``, ``"Traces"``). ``merge_traces`` keeps every
rank's complete and instant events, one process per rank (``pid`` = rank, named
``"rank r"``), one integer thread id per original thread, times from the first event of any
rank; the result passes ``lk.trace.check_chrome_trace`` and opens in Perfetto.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from numbers import Real
from typing import Any

__all__ = ["check_profiler_trace", "merge_traces", "self_times"]

PHASES = {"X", "B", "E", "i", "I", "M", "s", "t", "f", "C", "b", "e", "n"}


def _num(v: Any) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def check_profiler_trace(trace: Any, steps: int | None = None) -> int:
    """Check a torch.profiler Chrome trace: valid events, and the recorded steps in it.

    Args:
        trace: the parsed JSON (``json.load`` of the exported file).
        steps: if given, the number of ``ProfilerStep#N`` events expected.

    Returns:
        The number of complete (``"X"``) events.

    Raises:
        ValueError: listing each problem (no ``traceEvents`` list, unknown ``ph``, an
            ``X`` event without numeric ``ts``/``dur`` or with a negative ``dur``, an event
            without ``pid``/``tid``, a wrong number of steps, non-JSON values).
    """
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ValueError("a profiler trace is an object with a 'traceEvents' list")
    problems = []
    try:
        json.dumps(trace, allow_nan=False)
    except (TypeError, ValueError) as exc:
        problems.append(f"not serialisable as strict JSON: {exc}")
    n_complete, n_steps = 0, 0
    for i, e in enumerate(trace["traceEvents"]):
        where = f"traceEvents[{i}] ({e.get('name') if isinstance(e, dict) else e!r})"
        if not isinstance(e, dict) or e.get("ph") not in PHASES:
            problems.append(f"{where}: not an event with a known 'ph'")
            continue
        if not all(k in e for k in ("name", "pid", "tid")):
            problems.append(f"{where}: needs 'name', 'pid' and 'tid'")
        if e["ph"] == "X":
            n_complete += 1
            if not (_num(e.get("ts")) and _num(e.get("dur"))):
                problems.append(f"{where}: ph 'X' needs numeric 'ts' and 'dur' (µs)")
            elif e["dur"] < 0:
                problems.append(f"{where}: negative duration {e['dur']}")
            n_steps += (
                str(e.get("name", "")).startswith("ProfilerStep#")
                and e.get("cat") != "gpu_user_annotation"
            )  # the CPU side only, not its copy on a GPU stream
    if steps is not None and n_steps != steps:
        problems.append(f"{n_steps} ProfilerStep# events, expected {steps}")
    if problems:
        raise ValueError("invalid profiler trace:\n  " + "\n  ".join(problems))
    return n_complete


def merge_traces(traces: Sequence[dict[str, Any]], path: str | None = None) -> dict[str, Any]:
    """Every rank's profiler trace in one Chrome-trace file: one process per rank.

    Keeps complete and instant events of real processes (integer ``pid``); drops flow
    events and torch's string-named pseudo-processes. Threads become ``tid`` 0, 1, … in
    order of first appearance, named after the original thread (``main`` for the thread
    that ran the steps). Times are shifted so the first kept event of any rank is at 0;
    traces from one host share a clock, so ranks line up.

    Args:
        traces: ``traces[r]`` is rank r's parsed trace.
        path: also write the merged JSON there.

    Returns:
        dict: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``.

    Raises:
        ValueError: no traces, or a trace without ``traceEvents``.
        OSError: ``path`` cannot be written.
    """
    if not traces:
        raise ValueError("merge_traces needs at least one trace")
    kept: list[list[dict[str, Any]]] = []
    names: list[dict[Any, str]] = []
    for r, t in enumerate(traces):
        if not isinstance(t, dict) or not isinstance(t.get("traceEvents"), list):
            raise ValueError(f"trace {r} has no 'traceEvents' list")
        events = t["traceEvents"]
        real = [e for e in events if isinstance(e.get("pid"), int) and "tid" in e]
        kept.append([e for e in real if e.get("ph") in ("X", "i", "I") and _num(e.get("ts"))])
        names.append({
            e["tid"]: e["args"].get("name", str(e["tid"]))
            for e in real if e.get("ph") == "M" and e.get("name") == "thread_name"
        })  # fmt: skip
    origin = min((e["ts"] for events in kept for e in events), default=0.0)
    out: list[dict[str, Any]] = []
    for r, events in enumerate(kept):
        out.append({"name": "process_name", "ph": "M", "pid": r, "tid": 0,
                    "args": {"name": f"rank {r}"}})  # fmt: skip
        out.append({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0,
                    "args": {"sort_index": r}})  # fmt: skip
        main = {e["tid"] for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
        tids: dict[Any, int] = {}
        for e in sorted(events, key=lambda e: e["ts"]):
            if e["tid"] not in tids:
                tids[e["tid"]] = len(tids)
                label = "main" if e["tid"] in main else names[r].get(e["tid"], str(e["tid"]))
                out.append({"name": "thread_name", "ph": "M", "pid": r, "tid": tids[e["tid"]],
                            "args": {"name": label}})  # fmt: skip
            new = {k: v for k, v in e.items() if k not in ("pid", "tid", "ts")}
            new.update(pid=r, tid=tids[e["tid"]], ts=e["ts"] - origin)
            out.append(new)
    merged = {"traceEvents": out, "displayTimeUnit": "ms"}
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(merged, f)
    return merged


def self_times(trace: dict[str, Any]) -> dict[str, float]:
    """Self time per op name, ms, computed from the trace's events alone.

    An event's self time is its duration minus the durations of the events directly nested
    in it on the same thread — what ``key_averages()`` reports as self CPU time. Only CPU
    ops and annotations (``cat`` ``cpu_op``/``user_annotation``) count; the
    ``ProfilerStep#N`` events are left out.

    Args:
        trace: a parsed profiler trace.

    Returns:
        dict: op name → total self time in ms, largest first.
    """
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation"):
            by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    totals: dict[str, float] = {}
    for events in by_thread.values():
        stack: list[list[Any]] = []  # [end, name, self] of the open ancestors
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and e["ts"] >= stack[-1][0]:
                end, name, own = stack.pop()
                totals[name] = totals.get(name, 0.0) + own
            if stack:
                stack[-1][2] -= e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], e["dur"]])
        for _, name, own in stack:
            totals[name] = totals.get(name, 0.0) + own
    totals = {k: v / 1e3 for k, v in totals.items() if not k.startswith("ProfilerStep#")}
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))
