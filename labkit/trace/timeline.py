"""Every rank's spans on one time axis, with each rank's idle gaps.

Introduced in notebooks/04_custom_backend.ipynb.

``Timeline.merge(per_rank_events)`` takes what ``lk.trace.events()`` returned on each rank
(a list in rank order, as ``lk.launch`` returns it), shifts every clock so that 0 is the first
span of any rank, and finds, for each rank, the gaps in ``[0, end]`` that no span covers —
where ``end`` is the last span of *any* rank, so a rank that finished early waits for the
slowest one (a straggler shows up as idle time on everyone else).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from labkit.trace.chrome import to_chrome_trace
from labkit.trace.spans import COMM, Span


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, non-overlapping union of ``(start, end)`` intervals."""
    merged: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _gaps(busy: list[tuple[int, int]], start: int, end: int) -> list[tuple[int, int]]:
    """The parts of ``[start, end]`` that the (sorted, disjoint) ``busy`` intervals miss."""
    gaps, t = [], start
    for a, b in busy:
        if a > t:
            gaps.append((t, min(a, end)))
        t = max(t, b)
    if t < end:
        gaps.append((t, end))
    return [(a, b) for a, b in gaps if b > a]


def _length(intervals: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in intervals)


def _overlap(xs: list[tuple[int, int]], ys: list[tuple[int, int]]) -> int:
    """Total length covered by both disjoint sorted lists."""
    total, i, j = 0, 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        total += max(0, b - a)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return total


@dataclass(frozen=True)
class RankSummary:
    """Where one rank's time went, in seconds, over the whole timeline ``[0, end]``.

    ``compute_s`` and ``comm_s`` count time covered by at least one span of that kind;
    ``overlap_s`` the part of ``comm_s`` hidden under compute; ``idle_s`` time covered by
    no span at all. ``compute_s + comm_s - overlap_s + idle_s == total_s``.
    """

    rank: int
    compute_s: float
    comm_s: float
    overlap_s: float
    idle_s: float
    total_s: float


@dataclass(frozen=True)
class Timeline:
    """Spans of every rank on one axis (ns from the first span), with idle gaps per rank.

    Attributes:
        spans: every span, ``rank`` set to its index in the merged list, times shifted.
        world_size: number of ranks merged.
        end_ns: the end of the last span of any rank (the axis is ``[0, end_ns]``).
        idle: per rank, the ``(start_ns, end_ns)`` gaps that no span of that rank covers.
        origin_ns: the clock time that became 0 (the first span's start).
    """

    spans: list[Span]
    world_size: int
    end_ns: int
    idle: list[list[tuple[int, int]]]
    origin_ns: int = 0

    @classmethod
    def merge(
        cls,
        per_rank_events: Sequence[Sequence[Span]],
        offsets_ns: Sequence[int] | None = None,
    ) -> Timeline:
        """Put every rank's spans on one time axis and find each rank's idle gaps.

        Args:
            per_rank_events: ``per_rank_events[r]`` is what ``lk.trace.events()`` returned
                on rank r (e.g. the list ``lk.launch`` returns).
            offsets_ns: per rank, how far its clock runs ahead of the common one (subtracted
                from its times). Default: none, right for ranks on one host, whose clocks
                are the same monotonic clock.

        Returns:
            Timeline: spans shifted so the earliest starts at 0, and idle gaps per rank.

        Raises:
            ValueError: no ranks, a span ending before it starts, or ``offsets_ns`` of the
                wrong length.
        """
        world_size = len(per_rank_events)
        if world_size == 0:
            raise ValueError("merge needs the events of at least one rank")
        offsets = list(offsets_ns) if offsets_ns is not None else [0] * world_size
        if len(offsets) != world_size:
            raise ValueError(f"{len(offsets)} offsets for {world_size} ranks")
        shifted: list[Span] = []
        for rank, events in enumerate(per_rank_events):
            for s in events:
                if s.end_ns < s.start_ns:
                    raise ValueError(f"span {s.name!r} of rank {rank} ends before it starts")
                a, b = s.start_ns - offsets[rank], s.end_ns - offsets[rank]
                shifted.append(replace(s, rank=rank, start_ns=a, end_ns=b))
        origin = min((s.start_ns for s in shifted), default=0)
        spans = [
            replace(s, start_ns=s.start_ns - origin, end_ns=s.end_ns - origin) for s in shifted
        ]
        spans.sort(key=lambda s: (s.rank, s.start_ns, s.end_ns))
        end = max((s.end_ns for s in spans), default=0)
        idle = [
            _gaps(_union([(s.start_ns, s.end_ns) for s in spans if s.rank == r]), 0, end)
            for r in range(world_size)
        ]
        return cls(spans, world_size, end, idle, origin)

    def of_rank(self, rank: int, kind: str | None = None) -> list[Span]:
        """Rank ``rank``'s spans (of ``kind`` only, if given), in time order."""
        return [s for s in self.spans if s.rank == rank and (kind is None or s.kind == kind)]

    def summary(self) -> list[RankSummary]:
        """Per rank: seconds of compute, communication, their overlap, and idle time.

        Returns:
            list[RankSummary]: one row per rank, in rank order.
        """
        rows = []
        for r in range(self.world_size):
            comm = _union([(s.start_ns, s.end_ns) for s in self.of_rank(r) if s.kind == COMM])
            comp = _union([(s.start_ns, s.end_ns) for s in self.of_rank(r) if s.kind != COMM])
            rows.append(
                RankSummary(
                    rank=r,
                    compute_s=_length(comp) / 1e9,
                    comm_s=_length(comm) / 1e9,
                    overlap_s=_overlap(comp, comm) / 1e9,
                    idle_s=_length(self.idle[r]) / 1e9,
                    total_s=self.end_ns / 1e9,
                )
            )
        return rows

    def to_chrome_trace(self, path: str | None = None) -> dict[str, Any]:
        """This timeline as Chrome-trace JSON (opens in Perfetto and chrome://tracing).

        Args:
            path: also write the JSON to this file (default: only return it).

        Returns:
            dict: ``{"traceEvents": [...], "displayTimeUnit": "ms"}``; see
            ``labkit.trace.chrome`` for the layout.

        Raises:
            OSError: ``path`` cannot be written.
        """
        return to_chrome_trace(self, path)
