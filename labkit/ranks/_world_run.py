"""The kernel's side of a live world: the launcher's run, kept open between cells.

``WorldRun`` reuses ``labkit.launcher._run.LaunchRun`` for everything a launch already does
well — the loopback store, forking ranks from the warm zygote, relaying their stdout/stderr
with ``[rank r]`` prefixes, noticing crashes, collecting stack dumps, killing what is left —
and adds one Unix-socket connection per rank over which cells travel. Where a launch ends
when every rank has returned, a world's ranks run ``labkit.ranks._server.serve`` and wait for
the next cell until they are told to stop.
"""

from __future__ import annotations

import selectors
import signal
import socket
import struct
import time

from labkit.launcher._run import LaunchRun
from labkit.launcher._wire import FrameReader, send_msg
from labkit.launcher.errors import clean_stack_dump
from labkit.launcher.failure_policy import FAILURE_GRACE_S


class WorldRun(LaunchRun):
    """A ``LaunchRun`` whose ranks stay up and take requests over per-rank sockets."""

    def __init__(self, zygote, plan, payload: bytes, listener: socket.socket) -> None:
        super().__init__(zygote, plan, payload)
        self.listener = listener
        self.conns: dict[int, socket.socket] = {}
        self.lost: set[int] = set()  # ranks whose connection closed
        self.replies: dict[int, dict] = {}
        self.readers: dict[int, FrameReader] = {}

    # -- start ----------------------------------------------------------------------------
    def start(self) -> None:
        """Start the ranks and wait until every one has connected back (or fail)."""
        self.start_ranks()
        self.sel.register(self.listener, selectors.EVENT_READ, ("listen", None))
        deadline = time.monotonic() + self.plan.timeout
        while len(self.conns) < self.plan.world_size:
            self.raise_if_broken()
            if time.monotonic() >= deadline:
                raise self.timeout_error()
            self.poll(0.1)
        self.sel.unregister(self.listener)
        self.listener.close()

    # -- health ---------------------------------------------------------------------------
    def broken_ranks(self) -> list[int]:
        """Ranks that died, raised out of their serve loop, or dropped their connection."""
        self.note_exits()
        return [r.rank for r in self.ranks if r.exited or r.error or r.rank in self.lost]

    def raise_if_broken(self) -> None:
        """Raise the launcher's ``RankError`` once a rank is gone (after a short grace)."""
        broken = self.broken_ranks()
        if not broken:
            return
        end = time.monotonic() + FAILURE_GRACE_S
        while time.monotonic() < end:  # let exit codes and other ranks' errors arrive
            self.poll(0.05)
        for rank in broken:
            r = self.ranks[rank]
            if not r.exited and not r.error:
                r.error = {  # connection lost while alive: report it as the launcher would
                    "type": "ConnectionError",
                    "message": "rank lost its connection to the kernel",
                    "frames": [],
                    "exception": "ConnectionError: rank lost its connection to the kernel\n",
                }
        raise self.rank_error()

    # -- requests -------------------------------------------------------------------------
    def send(self, rank: int, msg: dict) -> None:
        try:
            send_msg(self.conns[rank], msg)
        except OSError:
            self.lost.add(rank)

    def interrupt(self, ranks: list[int]) -> None:
        """Send SIGINT to these ranks (a KeyboardInterrupt in the cell they are running)."""
        self.signal_ranks([self.pids[r] for r in ranks], signal.SIGINT)

    def stacks(self, ranks: list[int]) -> dict[int, str]:
        """Ask these ranks for their Python stacks (faulthandler, SIGUSR1) and collect them."""
        live = [self.ranks[r] for r in ranks if not self.ranks[r].exited]
        for r in live:
            r.stack = b""  # a dump of an earlier cell
        self.collect_stacks(live)
        return {r.rank: _clean(r.stack.decode(errors="replace")) for r in live}

    def zygote_gone(self) -> bool:
        """True once the zygote has stopped (``lk.shutdown()`` or a crash): the ranks died too."""
        return self.zygote.sock.fileno() == -1 or not self.zygote.alive()

    def stop(self, grace_s: float) -> None:
        """Ask every rank to leave its loop, wait ``grace_s``, then kill what is left."""
        if self.zygote_gone():
            for r in self.ranks:
                r.exited = True  # they died with it (parent-death signal): nothing to kill
        for rank in list(self.conns):
            self.send(rank, {"op": "stop"})
        try:
            # Exits are known from the zygote's reports: waiting for them (rather than reading
            # /proc) leaves no stale report behind that a later rank with a reused pid could
            # be mistaken for. The zygote reports only between the imports it warms up when
            # idle, so a world stopped in its first seconds may take a second or two.
            self.wait_exits(grace_s)
        finally:
            self.cleanup()
            for conn in self.conns.values():
                conn.close()
            self.listener.close()

    # -- the loop -------------------------------------------------------------------------
    def on_ready(self, key, kind: str, r) -> None:
        """Also handle the listener and the per-rank cell connections."""
        if kind == "listen":
            self._accept()
        elif kind in ("hello", "cell"):
            self._read_conn(key.fileobj, kind, r)
        else:
            super().on_ready(key, kind, r)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        if _peer_pid(conn) not in (None, *self.pids):
            conn.close()  # only our own ranks may talk to the kernel
            return
        self.sel.register(conn, selectors.EVENT_READ, ("hello", FrameReader()))

    def _read_conn(self, conn: socket.socket, kind: str, reader) -> None:
        rank = reader if kind == "cell" else None
        frames = self.readers[rank] if kind == "cell" else reader
        try:
            data = conn.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(conn)
            if rank is not None:
                self.lost.add(rank)
            conn.close()
            return
        for msg in frames.feed(data):
            if msg["op"] == "hello":
                rank = msg["rank"]
                self.conns[rank] = conn
                self.readers[rank] = frames
                self.sel.modify(conn, selectors.EVENT_READ, ("cell", rank))
            elif msg["op"] == "reply":
                self.replies[msg["rank"]] = msg


def _peer_pid(conn: socket.socket) -> int | None:
    """Pid of the process on the other end of a Unix socket (Linux), else None."""
    if not hasattr(socket, "SO_PEERCRED"):
        return None
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


def _clean(dump: str) -> str:
    """A rank's stack dump without the frames of the cell loop itself."""
    out, skipping = [], False
    for line in clean_stack_dump(dump).splitlines():
        if line.startswith("    ") and skipping:
            continue  # the source line under a skipped frame
        skipping = "labkit/ranks/_server.py" in line
        if not skipping:
            out.append(line)
    return "\n".join(out)
