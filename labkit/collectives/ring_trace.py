"""Run labkit's ring all-reduce on simulated ranks in one process, recording every step.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

``trace_ring_allreduce`` drives the very functions of ``labkit.collectives.ring`` (its ring
reduce-scatter and all-gather) on p threads, one per simulated rank. Each thread gets a
``ThreadP2P``: the same ``P2P`` interface, whose messages travel through in-process queues
instead of ``torch.distributed``, so ``exchange`` and the message counting are the real ones.
Every call to ``P2P.at(phase, step)`` is a barrier of all ranks, where every rank's buffer is
copied: the buffers between steps, each message's chunk and values, and which ranks'
inputs each element already sums (by running the algorithm a second time on inputs 2^r).
The ring stepper of ``lk.widgets`` shows this trace; no process group is needed.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

import torch

from labkit.collectives.counting import P2P, CommStats, count_messages
from labkit.collectives.expected import chunk_bounds
from labkit.collectives.ops import prepare
from labkit.collectives.ring import allreduce_ring_flat

__all__ = ["RingStep", "RingTrace", "ThreadP2P", "Transfer", "trace_ring_allreduce"]

_TIMEOUT_S = 30.0  # a simulated rank waiting longer than this is a bug, not a slow link


@dataclass(frozen=True)
class Transfer:
    """One message of the ring: ``src`` sends chunk ``chunk`` (these ``values``) to ``dst``."""

    src: int
    dst: int
    chunk: int
    values: tuple[float, ...]


@dataclass(frozen=True)
class RingStep:
    """One step of the ring: every rank's buffer before and after it, and the messages."""

    phase: str  # "reduce-scatter" or "all-gather"
    step: int  # 0-based within the phase
    before: list[list[float]]  # rank → its whole buffer
    after: list[list[float]]
    transfers: list[Transfer]  # one per rank, by sender
    contributors: list[list[tuple[int, ...]]]  # rank → element → input ranks summed (after)


@dataclass
class RingTrace:
    """A recorded ring all-reduce: inputs, the steps, the result, each rank's message counts."""

    world_size: int
    inputs: list[list[float]]
    chunks: list[tuple[int, int]]  # chunk c is elements [a, b)
    steps: list[RingStep] = field(default_factory=list)
    result: list[list[float]] = field(default_factory=list)
    stats: list[CommStats] = field(default_factory=list)

    def states(self) -> list[list[list[float]]]:
        """Every rank's buffer before step 0, after each step: 2(p−1) + 1 states."""
        if not self.steps:
            return [self.result]
        return [self.steps[0].before] + [s.after for s in self.steps]


class _Ring:
    """What the simulated ranks share: the links, the barrier and the recorded snapshots."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        p = len(buffers)
        self.buffers = buffers
        self.links = {(s, d): queue.Queue() for s in range(p) for d in range(p) if s != d}
        self.snapshots: list[tuple[str, int, list[list[float]]]] = []
        self.transfers: dict[tuple[str, int], list[Transfer]] = {}
        self.label = ("", 0)
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(p, action=self._snapshot, timeout=_TIMEOUT_S)

    def _snapshot(self) -> None:
        self.snapshots.append((*self.label, [b.tolist() for b in self.buffers]))


class _Done:
    """A completed or pending request; ``wait()`` finishes a receive."""

    def __init__(self, finish=None) -> None:
        self._finish = finish

    def wait(self) -> bool:
        if self._finish is not None:
            self._finish()
            self._finish = None
        return True


class ThreadP2P(P2P):
    """``P2P`` between threads of one process: rank r sends into a queue rank d reads.

    Args:
        ring: the shared state of the simulated ranks (built by ``trace_ring_allreduce``).
        rank: this thread's rank.

    Raises:
        Nothing of its own; a receive that waits over 30 s raises ``queue.Empty``.
    """

    def __init__(self, ring: _Ring, rank: int) -> None:  # no process group: skip P2P's
        self.group = None
        self.rank, self.world_size = rank, len(ring.buffers)
        self.phase, self.step = "", 0
        self._ring = ring

    def at(self, phase: str, step: int = 0) -> P2P:
        """Label what follows and wait for every rank: the buffers are recorded here."""
        super().at(phase, step)
        self._ring.label = (phase, step)
        self._ring.barrier.wait()
        return self

    def _chunk_of(self, tensor: torch.Tensor) -> int:
        base = self._ring.buffers[self.rank]
        offset = tensor.storage_offset() - base.storage_offset()  # a view of this rank's buffer
        bounds = chunk_bounds(base.numel(), self.world_size)
        # An empty chunk (fewer elements than ranks) is the first chunk at its offset.
        return next(c for c, (a, b) in enumerate(bounds) if a <= offset < b or a == b == offset)

    def isend(self, tensor: torch.Tensor, dst: int) -> _Done:
        """Put a copy of ``tensor`` on the link to ``dst`` (never blocks)."""
        self._record("send", dst, tensor)
        with self._ring.lock:
            self._ring.transfers.setdefault((self.phase, self.step), []).append(
                Transfer(self.rank, dst, self._chunk_of(tensor), tuple(tensor.tolist()))
            )
        self._ring.links[(self.rank, dst)].put(tensor.clone())
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int) -> _Done:
        """Receive into ``tensor`` from ``src`` when ``wait()`` is called."""
        self._record("recv", src, tensor)
        link = self._ring.links[(src, self.rank)]
        return _Done(lambda: tensor.copy_(link.get(timeout=_TIMEOUT_S)))

    def start(
        self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]]
    ) -> list[_Done]:
        """One step's sends and receives, as ``P2P.start`` (queues need no batching)."""
        return [self.isend(t, d) for t, d in sends] + [self.irecv(t, s) for t, s in recvs]

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Blocking send (a queue never blocks)."""
        self.isend(tensor, dst).wait()

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Blocking receive from ``src``."""
        self.irecv(tensor, src).wait()


def _run(buffers: list[torch.Tensor], op: str) -> tuple[_Ring, list[CommStats]]:
    """Ring all-reduce of ``buffers`` in place, one thread per rank, as ``allreduce_ring``."""
    ring = _Ring(buffers)
    stats: list[CommStats | None] = [None] * len(buffers)
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        try:
            p2p = ThreadP2P(ring, r)
            with count_messages() as mine:
                allreduce_ring_flat(p2p, buffers[r], op)
            stats[r] = mine
        except BaseException as exc:  # reported below, in the caller's thread
            errors.append(exc)
            ring.barrier.abort()

    threads = [
        threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(len(buffers))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:  # the first real error, not the broken barrier it left the others with
        raise next(
            (e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0]
        )
    ring._snapshot()  # the final buffers
    return ring, stats  # type: ignore[return-value]


def trace_ring_allreduce(inputs: list[list[float]] | torch.Tensor, op: str = "sum") -> RingTrace:
    """Run labkit's ring all-reduce on ``len(inputs)`` simulated ranks and record each step.

    Thakur, Rabenseifner and Gropp 2005, §4: p−1 reduce-scatter steps, then p−1 all-gather
    steps; in every step each rank sends one chunk to rank r+1 and receives one from r−1.

    Args:
        inputs: one equal-length buffer per rank (a list of lists, or a 2-D tensor whose
            rows are the ranks); its dtype is kept (float32 for lists).
        op: ``"sum"``, ``"max"``, ... (any of ``labkit.collectives.OPS``).

    Returns:
        The ``RingTrace``: 2(p−1) ``RingStep`` s, the final buffers and each rank's counts.

    Raises:
        ValueError: no ranks, buffers of different lengths or not 1-D, or an unknown op.
        TypeError: AVG of an integer tensor (as ``allreduce_ring``).
    """
    rows = torch.as_tensor(inputs) if not isinstance(inputs, torch.Tensor) else inputs
    if rows.dim() != 2 or rows.shape[0] < 1:
        raise ValueError("inputs must hold one 1-D buffer of the same length per rank")
    name = prepare(rows[0], op, None, check=False)  # allreduce_ring's checks, no group
    p, n = rows.shape
    buffers = [rows[r].clone().contiguous() for r in range(p)]
    ring, stats = _run(buffers, name)
    # Same schedule on inputs 2^r: each element's value is the set of ranks it sums.
    masks = [torch.full((n,), 1 << r, dtype=torch.int64) for r in range(p)]
    mask_ring, _ = _run(masks, "sum")

    def who(state: list[list[float]]) -> list[list[tuple[int, ...]]]:
        return [[tuple(q for q in range(p) if int(v) >> q & 1) for v in row] for row in state]

    trace = RingTrace(p, rows.tolist(), chunk_bounds(n, p), result=ring.snapshots[-1][2])
    trace.stats = stats
    snaps, mask_snaps = ring.snapshots, mask_ring.snapshots
    for k in range(len(snaps) - 1):
        phase, step, before = snaps[k]
        sent = sorted(ring.transfers.get((phase, step), []), key=lambda t: t.src)
        trace.steps.append(
            RingStep(phase, step, before, snaps[k + 1][2], sent, who(mask_snaps[k + 1][2]))
        )
    return trace
