"""torch.profiler over a few training steps on every rank: traces, top ops, comm vs compute.

Introduced in notebooks/20_performance_tuning.ipynb.

``profile_steps(step, trace_dir)`` runs inside a rank (a function ``lk.launch`` runs). It calls
``step()`` under ``torch.profiler.profile`` with the schedule ``wait, warmup, active``
(``torch.profiler.schedule``: skip ``wait`` steps, profile ``warmup`` steps and throw them
away — the profiler's own start-up cost lands there — then record ``active`` steps), writes
the rank's Chrome-trace JSON (``export_chrome_trace``) and returns a picklable
``RankProfile``: PyTorch's own per-op table (``key_averages``, self CPU time) and the
trace's events as ``lk.trace`` spans — top-level ops of the training thread as compute,
collectives on any thread (``gloo:all_reduce`` runs on gloo's worker thread, ``nccl:*`` as
GPU kernels) as communication.

Timestamps of traces taken on one host share one clock, so the ranks' traces can be merged
(``labkit.profile.merge_traces``) into one file that Perfetto (https://ui.perfetto.dev) and
chrome://tracing open with one process per rank.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from labkit.launcher import get_device
from labkit.trace import COMM, COMPUTE, Span, Timeline, sync_device

__all__ = [
    "CommComputeRow",
    "OpRow",
    "RankProfile",
    "comm_compute",
    "is_comm_op",
    "profile_steps",
    "trace_spans",
]

# Names the profiler gives to collectives: the c10d op the Python call dispatches, the
# backend's own span, and the record_param_comms annotation (torch/csrc/distributed/c10d).
COMM_PREFIXES = ("c10d::", "gloo:", "nccl:", "ncclDevKernel", "record_param_comms", "mpi:")
STEP_PREFIX = "ProfilerStep#"


def is_comm_op(name: str) -> bool:
    """Whether a profiler event named ``name`` is a collective (or point-to-point) op.

    Args:
        name: the event's name, e.g. ``"gloo:all_reduce"`` or ``"aten::mm"``.

    Returns:
        True for names starting with one of ``COMM_PREFIXES``.
    """
    return name.startswith(COMM_PREFIXES)


@dataclass(frozen=True)
class OpRow:
    """One row of PyTorch's per-op table (``prof.key_averages()``), times in ms.

    ``self_cpu_ms`` is the time inside the op minus the time in the ops it called;
    ``cpu_total_ms`` includes them. ``share`` is ``self_cpu_ms`` over the sum of every op's.
    """

    name: str
    calls: int
    self_cpu_ms: float
    cpu_total_ms: float
    share: float


@dataclass(frozen=True)
class RankProfile:
    """What ``profile_steps`` measured on one rank (picklable: return it from a rank).

    Attributes:
        rank: the rank.
        trace_path: the rank's Chrome-trace JSON file.
        steps: active (recorded) steps.
        step_ms: per active step, its duration (the profiler's ``ProfilerStep#N`` events).
        ops: PyTorch's per-op rows, by self CPU time, largest first.
        spans: the trace as ``lk.trace`` spans (compute: top-level ops of the training
            thread, with any collective inside them cut out; comm: every collective).
    """

    rank: int
    trace_path: str
    steps: int
    step_ms: tuple[float, ...]
    ops: tuple[OpRow, ...]
    spans: tuple[Span, ...]

    def top_ops(self, n: int = 10, include_comm: bool = True) -> list[OpRow]:
        """The ``n`` ops with the most self CPU time (collectives left out if asked).

        Args:
            n: how many rows.
            include_comm: False leaves out collectives (``is_comm_op``).

        Returns:
            list[OpRow]: largest self time first.
        """
        return [r for r in self.ops if include_comm or not is_comm_op(r.name)][:n]


def _op_rows(prof: Any) -> tuple[OpRow, ...]:
    events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    rows = [
        OpRow(e.key, e.count, e.self_cpu_time_total / 1e3, e.cpu_time_total / 1e3,
              e.self_cpu_time_total / total)
        for e in events
    ]  # fmt: skip
    return tuple(sorted(rows, key=lambda r: -r.self_cpu_ms))


def profile_steps(
    step: Callable[[], Any],
    trace_dir: str,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    record_shapes: bool = False,
    cuda: bool | None = None,
) -> RankProfile:
    """Run ``step()`` ``wait + warmup + active`` times under torch.profiler; keep ``active``.

    Call it on every rank (inside the function ``lk.launch`` runs): every rank runs the same steps,
    so their collectives match.

    Args:
        step: one training step (forward, backward, optimizer step), no arguments.
        trace_dir: folder for the trace; the rank's file is ``rank{r}.json`` in it.
        wait: steps run before the profiler starts (``torch.profiler.schedule``).
        warmup: steps profiled and discarded (the profiler's start-up cost).
        active: steps recorded (≥ 1).
        record_shapes: also record input shapes (bigger traces).
        cuda: also record CUDA kernels (default: when this rank's device, ``lk.get_device()``,
            is a GPU; outside ``lk.launch``, when this process has initialised CUDA). A CPU
            rank on a GPU machine records no CUDA activity. On a CUDA rank each step ends
            with ``torch.cuda.synchronize``, so a step's time covers its kernels.

    Returns:
        RankProfile: the trace's path, step times, PyTorch's op table and the spans.

    Raises:
        ValueError: ``active < 1`` or a negative ``wait``/``warmup``.
        OSError: the trace cannot be written.
    """
    from torch.profiler import ProfilerActivity, profile, schedule

    from labkit.trace.spans import current_rank

    if active < 1 or wait < 0 or warmup < 0:
        raise ValueError(
            f"need active >= 1, wait >= 0, warmup >= 0; got {active}, {wait}, {warmup}"
        )
    rank = current_rank()
    os.makedirs(trace_dir, exist_ok=True)
    path = os.path.join(trace_dir, f"rank{rank}.json")
    device = _rank_device()
    if cuda is None:
        cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    plan = schedule(wait=wait, warmup=warmup, active=active, repeat=1)
    with profile(activities=activities, schedule=plan, record_shapes=record_shapes) as prof:
        for _ in range(wait + warmup + active):
            step()
            sync_device(device)  # on a GPU, the step ends when its kernels have run
            prof.step()
    prof.export_chrome_trace(path)
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    steps = [e for e in trace["traceEvents"] if _is_step(e)]
    return RankProfile(
        rank=rank,
        trace_path=path,
        steps=len(steps),
        step_ms=tuple(e["dur"] / 1e3 for e in sorted(steps, key=lambda e: e["ts"])),
        ops=_op_rows(prof),
        spans=tuple(trace_spans(trace, rank)),
    )


def _rank_device() -> Any:
    """The launcher's device for this rank; outside a rank, CUDA only if already in use here."""
    import torch

    try:
        return get_device()
    except RuntimeError:  # not inside lk.launch; is_initialized() does not initialise CUDA
        return torch.device("cuda" if torch.cuda.is_initialized() else "cpu")


def _is_step(e: dict[str, Any]) -> bool:
    """A ``ProfilerStep#N`` event of the CPU side (not its copy on a GPU stream)."""
    return (
        e.get("ph") == "X"
        and str(e.get("name", "")).startswith(STEP_PREFIX)
        and e.get("cat") != "gpu_user_annotation"
    )


def _cut(a: float, b: float, holes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``[a, b]`` minus the (sorted, disjoint) ``holes``."""
    out, t = [], a
    for x, y in holes:
        if y <= t or x >= b:
            continue
        if x > t:
            out.append((t, x))
        t = max(t, y)
    if t < b:
        out.append((t, b))
    return out


def trace_spans(trace: dict[str, Any], rank: int = 0) -> list[Span]:
    """A profiler trace as ``lk.trace`` spans: compute on the training thread, and comm.

    Only the recorded steps count (the ``ProfilerStep#N`` events' span of time). Compute is
    each top-level op (``cat`` ``cpu_op``, or a GPU kernel) of the thread that ran the steps,
    with the collectives that thread ran inside it cut out; comm is each collective
    (``is_comm_op``) on any thread, not nested in another collective — so a collective on a
    backend's worker thread while the training thread computes counts as overlap. Time in
    neither is Python, waiting, or idle.

    Args:
        trace: the parsed JSON of ``export_chrome_trace``.
        rank: the rank to put on the spans.

    Returns:
        list[Span]: times in ns on the trace's clock, by start time.

    Raises:
        ValueError: the trace has no ``ProfilerStep#`` events (no step was recorded).
    """
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if _is_step(e)]
    if not steps:
        raise ValueError("the trace has no ProfilerStep# events: was any step recorded?")
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    main = {(e["pid"], e["tid"]) for e in steps}

    def clipped(e: dict[str, Any]) -> tuple[float, float] | None:
        a, b = max(e["ts"], lo), min(e["ts"] + e["dur"], hi)
        return (a, b) if b > a else None

    comm: list[tuple[float, float, str]] = []
    holes: list[tuple[float, float]] = []  # collectives the training thread itself ran
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        iv = clipped(e)
        if iv and is_comm_op(e["name"]) and not (comm and iv[1] <= comm[-1][1]):
            comm.append((*iv, e["name"]))
            if (e["pid"], e["tid"]) in main:
                holes.append(iv)
    compute: list[tuple[float, float, str]] = []
    end = lo
    for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
        on_main = (e["pid"], e["tid"]) in main and e.get("cat") == "cpu_op"
        if not (on_main or e.get("cat") == "kernel") or is_comm_op(e["name"]):
            continue
        iv = clipped(e)
        if iv is None or iv[1] <= end:  # nested in the previous top-level op
            continue
        end = iv[1]
        compute += [(a, b, e["name"]) for a, b in _cut(*iv, holes)]
    spans = [Span(n, COMM, int(a * 1e3), int(b * 1e3), rank) for a, b, n in comm]
    spans += [Span(n, COMPUTE, int(a * 1e3), int(b * 1e3), rank) for a, b, n in compute]
    return sorted(spans, key=lambda s: (s.start_ns, s.end_ns))


@dataclass(frozen=True)
class CommComputeRow:
    """Where one rank's recorded steps went, in ms per step, and as fractions of the step.

    ``other`` is time in neither compute nor communication: Python, data loading, waiting
    for a collective that the training thread blocks on, idle.
    """

    rank: int
    step_ms: float
    compute_ms: float
    comm_ms: float
    overlap_ms: float
    other_ms: float

    @property
    def comm_fraction(self) -> float:
        """Communication time over the step time."""
        return self.comm_ms / self.step_ms

    @property
    def compute_fraction(self) -> float:
        """Compute time over the step time."""
        return self.compute_ms / self.step_ms


def comm_compute(profiles: Sequence[RankProfile]) -> list[CommComputeRow]:
    """Per rank: compute, communication, their overlap and the rest, ms per recorded step.

    Uses ``lk.trace.Timeline`` on the profiles' spans; the step time is the mean ``ProfilerStep#N``
    duration.

    Args:
        profiles: every rank's ``RankProfile``, in rank order.

    Returns:
        list[CommComputeRow]: one row per rank.

    Raises:
        ValueError: no profiles.
    """
    if not profiles:
        raise ValueError("comm_compute needs at least one RankProfile")
    rows = []
    for p in profiles:
        (s,) = Timeline.merge([list(p.spans)]).summary()
        n, step_ms = p.steps, sum(p.step_ms)
        busy_ms = 1e3 * (s.compute_s + s.comm_s - s.overlap_s)
        rows.append(
            CommComputeRow(
                rank=p.rank,
                step_ms=step_ms / n,
                compute_ms=1e3 * s.compute_s / n,
                comm_ms=1e3 * s.comm_s / n,
                overlap_ms=1e3 * s.overlap_s / n,
                other_ms=max(0.0, step_ms - busy_ms) / n,
            )
        )
    return rows
