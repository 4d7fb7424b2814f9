"""Synchronisation through counters in shared memory: rounds, waiting, dead peers, timeouts.

Introduced in notebooks/04_custom_backend.ipynb.

A collective is a sequence of *rounds*. In a round every rank writes its data into its slot
of the current buffer, then *signals* (adds 1 to its own round counter) and *waits* until
every peer's counter has reached its own: from then on it may read everybody's slots. Rounds
use three buffers in turn, so a fast rank writing round t+1 never overwrites what a slow rank
still reads from round t (or, in the pipelined all_reduce, from round t-1); and before it
writes round t+3 into the same buffer it has waited in round t+2, which every rank enters only
after its reads of round t are done. Counters only grow, so no reset is ever needed and a rank
is at most one signal ahead.

Memory ordering. The protocol is "write data, then store the counter" on one side and "load
the counter, then read data" on the other. x86-64 is TSO: stores become visible in program
order and loads are not reordered with older loads, so a peer that sees the counter also
sees the data (even after ``memcpy``'s non-temporal stores, which glibc ends with ``sfence``).
The compiler cannot reorder either, because the Python interpreter puts opaque calls between
the copy and the counter store. On a weakly ordered CPU (ARM, POWER) this would need release
and acquire fences, which Python cannot issue: there, treat this backend as a model of the
algorithm, not as a correct implementation (a C++ backend would use std::atomic).

Waiting spins briefly (the fastest wake-up; only while every rank has a core of its own),
then yields the CPU to other ranks sharing it, then blocks on the awaited counter with a futex
(``futex.py``): every rank wakes its counter's sleepers right after storing it, so a blocked
rank costs no CPU and wakes as soon as the peer arrives. Where futexes are missing it sleeps
with growing pauses instead (and wakes up to a pause late). Every few milliseconds it checks
the deadline and that the awaited rank's process is still alive, so a dead peer or a timeout
ends in a RuntimeError that names the rank and the operation instead of a hang.
"""

from __future__ import annotations

import os
import time

from labkit.backends._shm import futex
from labkit.backends._shm.describe import kind_name
from labkit.backends._shm.layout import (
    NBUF,
    STATE_LEFT,
    W_KIND,
    W_ROUND,
    W_SEQ,
    W_STATE,
)

SPIN_S = 20e-6  # busy polling: wake-up within a microsecond
YIELD_S = 2e-3  # then sched_yield, so ranks (and other programs) sharing a core can run
MAX_SLEEP_S = 500e-6  # then sleep, doubling from 50 us up to this
CHECK_EVERY_S = 5e-3  # how often a waiter checks the deadline and the peers' pids
_CHECK_TS = futex.timespec(CHECK_EVERY_S)  # the longest futex sleep between checks


class GroupFailure(RuntimeError):
    """A peer died, left or timed out: the group's rounds are out of step and it is unusable."""


def _process_gone(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:  # a zombie (dead, not yet reaped by its parent) still answers kill(pid, 0)
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


class PeerWatch:
    """Knows every rank's pid and tells whether a rank's process is gone."""

    def __init__(self, rank: int, pids: list[int]) -> None:
        self.rank = rank
        self.pids = pids
        self.segment = None  # set once mapped: then a rank that destroyed its group counts too

    def gone(self, r: int) -> str | None:
        """Why rank ``r`` can no longer take part (None while it can)."""
        if _process_gone(self.pids[r]):
            return f"rank {r} (pid {self.pids[r]}) is gone: its process exited or was killed"
        seg = self.segment
        if seg is not None and seg.ctl[seg.layout.word(r, W_STATE)] == STATE_LEFT:
            return f"rank {r} has destroyed its process group"
        return None

    def check_alive(self, ranks, what: str) -> None:
        for r in ranks:
            why = self.gone(r)
            if why:
                raise GroupFailure(f"labkit_shm: {why} ({what}, seen by rank {self.rank})")


class Waiter:
    """Backoff for one wait: spin, then yield, then sleep; ``pause()`` says when to check."""

    __slots__ = ("start", "next_check", "sleep")

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.next_check = self.start + CHECK_EVERY_S
        self.sleep = 50e-6

    def pause(self) -> bool:
        """Wait a little; True when it is time to check the deadline and the peers."""
        now = time.monotonic()
        waited = now - self.start
        if waited >= YIELD_S:
            time.sleep(self.sleep)
            self.sleep = min(self.sleep * 2, MAX_SLEEP_S)
        elif waited >= SPIN_S:
            os.sched_yield()
        if now >= self.next_check:
            self.next_check = now + CHECK_EVERY_S
            return True
        return False


class Rounds:
    """The round counters of one group: ``arrive`` signals and waits for every peer."""

    def __init__(self, seg, rank: int, watch: PeerWatch, timeout_s: float) -> None:
        self.seg = seg
        self.ctl = seg.ctl
        self.rank = rank
        self.n = seg.layout.world_size
        self.watch = watch
        self.timeout_s = timeout_s
        self.t = 0  # rounds finished by this rank; the buffer of the next round is t % NBUF
        self._mine = seg.layout.word(rank, W_ROUND)
        self._peers = [(r, seg.layout.word(r, W_ROUND)) for r in range(self.n) if r != rank]
        self._count = self.ctl[self._mine]
        # Futex addresses of every rank's counter (its low 32 bits: x86-64 and arm64 are
        # little-endian), or None to poll. Spin first only while every rank has a core (with
        # more ranks than cores a spinning rank holds the core a peer needs), yield for
        # YIELD_S, and only then block: waking a rank blocked on a futex took 0.2-1 ms on
        # our (virtual, shared) machines, far more than most waits here (see futex.py).
        base = seg.bytes.data_ptr()
        words = [seg.layout.word(r, W_ROUND) for r in range(self.n)]
        self._addr = [base + 8 * w for w in words] if futex.AVAILABLE else None
        self.spin_s = SPIN_S if self.n <= (os.cpu_count() or 1) else 0.0
        self.yield_s = YIELD_S

    @property
    def buf(self) -> int:
        return self.t % NBUF

    def enter(self, seq: int, kind: int) -> None:
        """Publish which collective this rank is in (for other ranks' timeout messages)."""
        lay = self.seg.layout
        self.ctl[lay.word(self.rank, W_SEQ)] = seq
        self.ctl[lay.word(self.rank, W_KIND)] = kind

    def arrive(self, what: str) -> None:
        """Signal this rank's arrival, then wait until every peer has arrived too."""
        self._count += 1
        self.ctl[self._mine] = self._count  # after this rank's slot writes (see the docstring)
        if self._addr is not None:
            futex.wake(self._addr[self.rank])
        target = self._count
        ctl = self.ctl
        waiter = None  # one per arrival: the timeout covers the whole wait
        for r, w in self._peers:
            if ctl[w] < target:
                waiter = waiter or Waiter()
                self._wait_for(r, w, target, what, waiter)

    def _wait_for(self, r: int, w: int, target: int, what: str, waiter: Waiter) -> None:
        """Wait until rank ``r``'s counter (word ``w``) reaches ``target``."""
        ctl = self.ctl
        if self._addr is None:  # no futexes: spin, yield, sleep
            while ctl[w] < target:
                if waiter.pause():
                    self._check(r, what, waiter.start)
            return
        spin_until, yield_until = waiter.start + self.spin_s, waiter.start + self.yield_s
        while ctl[w] < target and (now := time.monotonic()) < yield_until:
            if now >= spin_until:
                os.sched_yield()
        addr = self._addr[r]
        while (seen := ctl[w]) < target:
            futex.wait(addr, seen, _CHECK_TS)  # a wake, a changed word or CHECK_EVERY_S
            if time.monotonic() >= waiter.next_check:
                waiter.next_check = time.monotonic() + CHECK_EVERY_S
                self._check(r, what, waiter.start)

    def next_round(self) -> None:
        self.t += 1

    def _check(self, r: int, what: str, since: float) -> None:
        why = self.watch.gone(r)
        if why:
            raise GroupFailure(f"labkit_shm: {what}: {why} (rank {self.rank} was waiting for it)")
        if time.monotonic() - since > self.timeout_s:
            # "Timed out", c10d's word (gloo: "Timed out waiting ..."), which callers and
            # PyTorch's own tests match.
            raise GroupFailure(
                f"labkit_shm: {what} on rank {self.rank}: Timed out after {self.timeout_s:g} s "
                f"waiting for rank {r}, {self._where(r)}"
            )

    def _where(self, r: int) -> str:
        lay = self.seg.layout
        seq, kind = self.ctl[lay.word(r, W_SEQ)], self.ctl[lay.word(r, W_KIND)]
        if seq == 0:
            return "which has not entered any collective on this group"
        return f"whose last collective on this group is #{seq} ({kind_name(kind)})"

    def leave(self) -> None:
        """Tell the peers this rank destroyed its group (their waits end with an error)."""
        self.ctl[self.seg.layout.word(self.rank, W_STATE)] = STATE_LEFT
