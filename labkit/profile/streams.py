"""Where a profiler trace ran its collectives: CPU threads, CUDA streams, and their overlap.

Introduced in notebooks/20_performance_tuning.ipynb.

A trace from ``torch.profiler`` (``export_chrome_trace``) places every CPU event on the thread
that ran it (``pid``, ``tid``, with ``thread_name`` metadata) and, with
``ProfilerActivity.CUDA``, every GPU kernel on its device and stream (``cat`` ``"kernel"``,
``args.device``, ``args.stream``), tied by ``args.correlation`` to the ``cuda_runtime`` /
``cuda_driver`` call that launched it on a CPU thread (Kineto's trace format).

- gloo runs a collective on its own worker threads (``pt_gloo_runloop``): the training
  thread dispatches ``c10d::allreduce_`` and the ``gloo:all_reduce`` span lies on another
  thread (``collective_threads``).
- NCCL runs a collective as a GPU kernel (``ncclDevKernel_*``, ``ncclKernel_*`` in older
  NCCL) on a stream of the process group's own, not on the compute stream, so DDP's
  all-reduce of a bucket can run while backward kernels still run (``nccl_overlap``).
  The autograd engine runs the backward of CUDA tensors on its own thread per device, so
  the kernels launched from threads other than the training thread are backward's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "KernelSpan",
    "NcclOverlap",
    "ThreadSplit",
    "collective_threads",
    "gpu_kernels",
    "is_nccl_kernel",
    "nccl_overlap",
]

NCCL_KERNEL_PREFIXES = ("ncclDevKernel", "ncclKernel")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")


def is_nccl_kernel(name: str) -> bool:
    """Whether a GPU kernel named ``name`` is NCCL's (``ncclDevKernel_AllReduce_...``).

    Args:
        name: the kernel's name in the trace.

    Returns:
        True for names starting with ``ncclDevKernel`` (current NCCL) or ``ncclKernel``
        (older releases).
    """
    return name.startswith(NCCL_KERNEL_PREFIXES)


def _complete(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]


def _step_threads(events: list[dict[str, Any]]) -> set[tuple[Any, Any]]:
    return {
        (e["pid"], e["tid"])
        for e in events
        if str(e.get("name", "")).startswith("ProfilerStep#")
        and e.get("cat") != "gpu_user_annotation"
    }


@dataclass(frozen=True)
class ThreadSplit:
    """On which CPU threads a trace's events of one kind ran.

    Attributes:
        on_main: events on the thread that ran the profiled steps.
        on_other: events on any other thread.
        other_threads: the names of those other threads (``thread_name`` metadata, else
            the thread id as a string; a thread renamed after it started, as gloo's
            ``pt_gloo_runloop`` workers are, has its names joined by ``" | "``).
    """

    on_main: int
    on_other: int
    other_threads: tuple[str, ...]


def collective_threads(trace: dict[str, Any], prefix: str = "gloo:") -> ThreadSplit:
    """Count the events whose name starts with ``prefix`` on the training thread and off it.

    Args:
        trace: a parsed profiler trace.
        prefix: the events' name prefix (``"gloo:"``: gloo's collective spans;
            ``"c10d::"``: the ops the training thread dispatches).

    Returns:
        ThreadSplit: the counts, and the other threads' names, sorted.

    Raises:
        ValueError: the trace has no ``ProfilerStep#`` events (no training thread to name).
    """
    events = _complete(trace)
    main = _step_threads(events)
    if not main:
        raise ValueError("the trace has no ProfilerStep# events: was any step recorded?")
    names: dict[tuple[Any, Any], set[str]] = {}  # a thread may be named twice (renamed)
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names.setdefault((e["pid"], e["tid"]), set()).add(str(e.get("args", {}).get("name")))
    ops = [e for e in events if str(e.get("name", "")).startswith(prefix)]
    other = {(e["pid"], e["tid"]) for e in ops} - main
    return ThreadSplit(
        on_main=sum((e["pid"], e["tid"]) in main for e in ops),
        on_other=sum((e["pid"], e["tid"]) not in main for e in ops),
        other_threads=tuple(sorted(" | ".join(sorted(names.get(t, {str(t[1])}))) for t in other)),
    )


@dataclass(frozen=True)
class KernelSpan:
    """One GPU kernel of a trace, times in µs on the trace's clock.

    Attributes:
        name: the kernel's name.
        device: the GPU's index.
        stream: the CUDA stream it ran on.
        start_us, end_us: when it ran.
        from_main: True if the training thread launched it, False if another thread did
            (autograd's device thread: backward), None if the trace does not say.
    """

    name: str
    device: int
    stream: int
    start_us: float
    end_us: float
    from_main: bool | None


def gpu_kernels(trace: dict[str, Any]) -> list[KernelSpan]:
    """The trace's GPU kernels, with the thread that launched each, by start time.

    Args:
        trace: a parsed profiler trace taken with ``ProfilerActivity.CUDA``.

    Returns:
        list[KernelSpan]: empty for a CPU-only trace.
    """
    events = _complete(trace)
    main = _step_threads(events)
    launcher = {
        e["args"]["correlation"]: (e["pid"], e["tid"]) in main
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    out = []
    for e in events:
        if e.get("cat") != "kernel":
            continue
        args = e.get("args", {})
        out.append(
            KernelSpan(
                name=str(e["name"]),
                device=int(args.get("device", e["pid"])),
                stream=int(args.get("stream", e["tid"])),
                start_us=float(e["ts"]),
                end_us=float(e["ts"]) + float(e["dur"]),
                from_main=launcher.get(args.get("correlation")),
            )
        )
    return sorted(out, key=lambda k: (k.start_us, k.end_us))


def _union(spans: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def _covered(a: float, b: float, union: list[tuple[float, float]]) -> float:
    return sum(max(0.0, min(b, y) - max(a, x)) for x, y in union)


@dataclass(frozen=True)
class NcclOverlap:
    """NCCL's kernels against the compute kernels of one trace (one rank, one GPU).

    Attributes:
        n_nccl: NCCL kernels.
        nccl_streams: the streams they ran on.
        compute_streams: the streams every other kernel ran on.
        nccl_us: their summed duration.
        overlap_us: the part of it during which a backward kernel ran on another stream (a
            kernel not launched by the training thread; all non-NCCL kernels if the trace
            does not say which thread launched them).
        n_backward: the kernels counted as backward's.
    """

    n_nccl: int
    nccl_streams: tuple[int, ...]
    compute_streams: tuple[int, ...]
    nccl_us: float
    overlap_us: float
    n_backward: int

    @property
    def overlap_fraction(self) -> float:
        """The share of NCCL's kernel time hidden under backward compute (0 without NCCL)."""
        return self.overlap_us / self.nccl_us if self.nccl_us else 0.0


def nccl_overlap(trace: dict[str, Any]) -> NcclOverlap:
    """How much of NCCL's kernel time ran while backward kernels ran, read from a trace.

    Args:
        trace: a parsed profiler trace of a CUDA rank (``ProfilerActivity.CUDA``).

    Returns:
        NcclOverlap: streams, times and the overlap (µs).
    """
    kernels = gpu_kernels(trace)
    nccl = [k for k in kernels if is_nccl_kernel(k.name)]
    compute = [k for k in kernels if not is_nccl_kernel(k.name)]
    known = any(k.from_main is not None for k in compute)
    backward = [k for k in compute if k.from_main is False or not known]
    union = _union((k.start_us, k.end_us) for k in backward)
    return NcclOverlap(
        n_nccl=len(nccl),
        nccl_streams=tuple(sorted({k.stream for k in nccl})),
        compute_streams=tuple(sorted({k.stream for k in compute})),
        nccl_us=sum(k.end_us - k.start_us for k in nccl),
        overlap_us=sum(_covered(k.start_us, k.end_us, union) for k in nccl),
        n_backward=len(backward),
    )
