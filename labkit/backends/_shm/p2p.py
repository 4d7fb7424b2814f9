"""send / recv: a progress thread that moves messages through the mailboxes.

Introduced in notebooks/04_custom_backend.ipynb.

``isend`` must not wait for the receiver (a ring of ``isend`` then ``recv`` would deadlock),
so every send and recv becomes a pending operation that one background thread per group
advances: it writes what fits into each destination's ring and copies out what has arrived,
spinning, then yielding, then sleeping when nothing moves. Messages from one sender arrive in
order; a receive takes the first message from its source with its tag (MPI's matching rule),
and a message that arrives while only receives with other tags wait is kept aside
("unexpected") so that those can proceed. The thread exits when it has been idle a while and
starts again with the next operation. Errors (a size mismatch, a dead peer, the timeout) fail
that operation's ``Work``: ``wait()`` raises a RuntimeError naming both ranks.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
import weakref
from collections import deque

import torch

from labkit.backends._pg_util import FutureWork, describe
from labkit.backends._shm.mailbox import InBox, OutBox, dtype_code, dtype_of
from labkit.backends._shm.sync import CHECK_EVERY_S, Waiter

IDLE_EXIT_S = 1.0
JOIN_S = 10.0  # close() waits at most this long for the progress thread (it takes ~1 ms)
_open: weakref.WeakSet[PointToPoint] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """At interpreter exit, before daemon threads are stopped: close every group's p2p."""
    for p2p in list(_open):
        p2p.close()


class _Op:
    """A pending send or recv."""

    def __init__(self, kind, peer, tag, tensor, timeout_s, order) -> None:
        self.kind, self.peer, self.tag, self.user = kind, peer, tag, tensor
        self.work = FutureWork()
        # Bytes to move: a contiguous tensor (a copy, for a non-contiguous user tensor),
        # detached: c10d moves data outside autograd, so a tensor that requires grad (DDP
        # with create_graph=True) is read and written like any other.
        data = tensor.detach()
        self.copied = not data.is_contiguous()
        self.buf = data.contiguous() if self.copied else data
        self.data = self.buf.reshape(-1).view(torch.uint8)
        self.dtype_code, self.numel = dtype_code(tensor.dtype), tensor.numel()
        self.deadline = time.monotonic() + timeout_s
        self.order = order  # post order: a message matches the earliest fitting recv
        self.started = self.finished = False
        self.done_bytes = 0

    def label(self, rank: int) -> str:
        if self.kind == "send":
            return f"send from rank {rank} to rank {self.peer} (tag {self.tag})"
        src = "any rank" if self.peer < 0 else f"rank {self.peer}"
        return f"recv on rank {rank} from {src} (tag {self.tag}, {describe(self.user)})"


class _Incoming:
    """The message being copied out of one inbox, and where it goes."""

    def __init__(self, op, target, nbytes, header) -> None:
        self.op, self.target, self.nbytes, self.header, self.got = op, target, nbytes, header, 0


class PointToPoint:
    """Pending sends and recvs of one group and the thread that moves them."""

    def __init__(self, seg, rank: int, watch, timeout_s: float) -> None:
        n = seg.layout.world_size
        self.rank, self.n, self.watch, self.timeout_s = rank, n, watch, timeout_s
        self.out = {d: OutBox(seg, rank, d) for d in range(n) if d != rank}
        self.inb = {s: InBox(seg, s, rank) for s in range(n) if s != rank}
        self._lock = threading.Condition()
        self._new: list[_Op] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        self._order = itertools.count()
        self.sends: dict[int, deque[_Op]] = {d: deque() for d in self.out}
        self.recvs: list[_Op] = []  # posted, in post order (peer -1: any source)
        self.unexpected: dict[int, deque] = {s: deque() for s in self.inb}
        self.broken: dict[int, str] = {}  # peer -> why its pair can no longer be used
        _open.add(self)

    # -- called by the group (any thread) -------------------------------------------------
    def post(self, kind: str, peer: int, tag: int, tensor: torch.Tensor) -> FutureWork:
        op = _Op(kind, peer, tag, tensor, self.timeout_s, next(self._order))
        with self._lock:
            if self._closed:
                why = "after the group was destroyed"
                raise RuntimeError(f"labkit_shm: {op.label(self.rank)} {why}")
            self._new.append(op)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"labkit_shm p2p rank {self.rank}", daemon=True
                )
                self._thread.start()
            else:
                self._lock.notify()
        return op.work

    def close(self) -> None:
        """Fail what is still pending, stop the progress thread and wait until it has exited.

        The thread is a daemon (a pending recv must not keep the interpreter alive), and a
        daemon thread still running when the interpreter finalizes is stopped inside
        whatever torch call it is in: that aborts the process ("terminate called without an
        active exception", SIGABRT) after a clean ``destroy_process_group()``. So closing
        joins it, and ``_close_all`` does the same at exit for groups never destroyed.
        """
        with self._lock:
            self._closed = True
            self._lock.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(JOIN_S)

    # -- the progress thread ---------------------------------------------------------------
    def _run(self) -> None:
        waiter, next_check = None, time.monotonic() + CHECK_EVERY_S
        while True:
            with self._lock:
                if not self._busy() and not self._new:
                    if not self._closed:
                        self._lock.wait(IDLE_EXIT_S)
                    if not self._new:
                        self._thread = None
                        return
                new, self._new = self._new, []
            try:
                for op in new:
                    self._accept(op)
                moved = self._step()
            except Exception as exc:  # noqa: BLE001 - a bug or corruption: fail, never hang
                self._fail_all(f"the progress thread failed: {type(exc).__name__}: {exc}")
                self.broken.update(dict.fromkeys(self.out, "the progress thread failed"))
                continue
            if moved:
                waiter = None
            else:
                waiter = waiter or Waiter()
                waiter.pause()
            if time.monotonic() >= next_check:
                next_check = time.monotonic() + CHECK_EVERY_S
                self._check()
            if self._closed:
                self._fail_all("the group was destroyed")

    def _busy(self) -> bool:
        return (
            bool(self.recvs)
            or any(self.sends.values())
            or any(b.current for b in self.inb.values())
        )

    def _accept(self, op: _Op) -> None:
        if op.peer in self.broken:
            op.work.fail(RuntimeError(f"labkit_shm: {op.label(self.rank)}: {self.broken[op.peer]}"))
        elif op.kind == "send":
            self.sends[op.peer].append(op)
        elif not self._take_unexpected(op):
            self.recvs.append(op)

    def _take_unexpected(self, op: _Op) -> bool:
        sources = [op.peer] if op.peer >= 0 else sorted(self.unexpected)
        for s in sources:
            for item in self.unexpected[s]:
                if item[0][0] == op.tag:
                    self.unexpected[s].remove(item)
                    header, data = item
                    if self._fits(op, s, header):
                        op.data.copy_(data)
                        self._complete(op, s)
                    return True
        return False

    def _step(self) -> bool:
        moved = False
        for d, queue in self.sends.items():
            while queue and d not in self.broken:
                op = queue[0]
                moved |= self.out[d].step(op)
                if not op.finished:
                    break
                queue.popleft()
                self._complete(op, self.rank)
        for s, box in self.inb.items():
            if s not in self.broken:
                moved |= self._receive(s, box)
        return moved

    def _receive(self, s: int, box: InBox) -> bool:
        moved = False
        while True:
            cur = box.current
            if cur is None:
                if not any(op.peer in (s, -1) for op in self.recvs):
                    return moved  # nobody waits for s: leave its messages in the ring
                header = box.peek_header()
                if header is None:
                    return moved
                box.consume_header()
                op = self._match(s, header[0])
                target = None
                if op is None:  # no recv with this tag yet: keep it aside
                    target = torch.empty(header[1], dtype=torch.uint8)
                elif self._fits(op, s, header):
                    target = op.data
                cur = box.current = _Incoming(op, target, header[1], header)
                moved = True
            got = box.step(cur.target, cur.got, cur.nbytes)
            moved |= got != cur.got or cur.nbytes == 0
            cur.got = got
            if got < cur.nbytes:
                return moved
            box.current = None
            if cur.op is None:
                self.unexpected[s].append((cur.header, cur.target))
            elif cur.target is not None:
                self._complete(cur.op, s)

    def _match(self, s: int, tag: int) -> _Op | None:
        for op in self.recvs:  # post order
            if op.peer in (s, -1) and op.tag == tag:
                self.recvs.remove(op)
                return op
        return None

    def _fits(self, op: _Op, s: int, header) -> bool:
        _, nbytes, code, numel, count = header
        if nbytes == op.data.numel() and code == op.dtype_code and numel == op.numel:
            return True
        op.work.fail(
            RuntimeError(
                f"labkit_shm: {op.label(self.rank)}: message {count} from rank {s} is "
                f"{dtype_of(code)}[{numel}] ({nbytes} bytes) but rank {self.rank} posted "
                f"{describe(op.user)}; send and recv must pass the same dtype and size"
            )
        )
        return False

    def _complete(self, op: _Op, source: int) -> None:
        if op.kind == "recv" and op.copied:
            op.user.detach().copy_(op.buf)
        op.work.complete([op.user], source_rank=source)

    # -- failures --------------------------------------------------------------------------
    def _check(self) -> None:
        now = time.monotonic()
        pending = [*self.recvs, *(op for q in self.sends.values() for op in q)]
        pending += [b.current.op for b in self.inb.values() if b.current and b.current.op]
        for op in pending:
            peers = [op.peer] if op.peer >= 0 else list(self.inb)
            gone = [why for p in peers if (why := self.watch.gone(p))]
            if gone and len(gone) == len(peers) and not self._data_waiting(op):
                self._fail(op, gone[0])
            elif now > op.deadline:
                self._fail(op, f"Timed out after {self.timeout_s:g} s")

    def _data_waiting(self, op: _Op) -> bool:
        if op.kind == "send":
            return False
        sources = [op.peer] if op.peer >= 0 else list(self.inb)
        return any(self.inb[s].available() > 0 for s in sources)

    def _fail(self, op: _Op, why: str) -> None:
        op.work.fail(RuntimeError(f"labkit_shm: {op.label(self.rank)}: {why}"))
        if op in self.recvs:
            self.recvs.remove(op)
        for p in [op.peer] if op.peer >= 0 else []:
            # The stream with p may be cut mid-message: nothing more can pass on this pair.
            self.broken[p] = why
            for other in list(self.sends[p]) + [o for o in self.recvs if o.peer == p]:
                other.work.fail(RuntimeError(f"labkit_shm: {other.label(self.rank)}: {why}"))
                if other in self.recvs:
                    self.recvs.remove(other)
            self.sends[p].clear()
            self.inb[p].current = None

    def _fail_all(self, why: str) -> None:
        ops = [*self.recvs, *(op for q in self.sends.values() for op in q)]
        ops += [b.current.op for b in self.inb.values() if b.current and b.current.op]
        for op in ops:
            op.work.fail(RuntimeError(f"labkit_shm: {op.label(self.rank)}: {why}"))
        self.recvs.clear()
        for q in self.sends.values():
            q.clear()
        for box in self.inb.values():
            box.current = None
