"""The launcher's side of the zygote: start it once per kernel, ask it for ranks, stop it.

Introduced in notebooks/00_setup_and_launcher.ipynb (``lk.shutdown``).

The zygote is the only process that stays between launches (the "warm pool"); it never grows,
it dies with the kernel (Linux parent-death signal, plus an ``atexit`` hook elsewhere) and
``lk.shutdown()`` stops it explicitly.
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from labkit.launcher._wire import FrameReader, send_msg

START_TIMEOUT_S = 180.0  # importing torch on a cold, busy laptop can take a while


class ZygoteError(RuntimeError):
    """The zygote could not be started or stopped responding."""


class Zygote:
    """A running zygote process and the socket to it."""

    def __init__(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])  # the folder that holds labkit/
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        env["MPLBACKEND"] = "Agg"
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "labkit.launcher._zygote",
                str(child_sock.fileno()),
                str(os.getpid()),
            ],
            pass_fds=[child_sock.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the launcher only
            env=env,
        )
        child_sock.close()
        self.sock = parent_sock
        self.pid = self.proc.pid
        self.exits: dict[int, int] = {}  # pid -> exit code, as reported by the zygote
        self._reader = FrameReader()
        msg = self._wait_for("ready", START_TIMEOUT_S)
        assert msg["pid"] == self.pid

    # -- messages -------------------------------------------------------------------------
    def _handle(self, msg: dict) -> dict | None:
        if msg["op"] == "exit":
            self.exits[msg["pid"]] = msg["code"]
            return None
        return msg

    def pump(self) -> None:
        """Read whatever the zygote has sent without blocking (call when its socket is ready)."""
        while True:
            try:
                data = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return
            if not data:
                raise ZygoteError("the zygote process exited unexpectedly")
            for msg in self._reader.feed(data):
                self._handle(msg)

    def _wait_for(self, op: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ZygoteError(f"the zygote did not answer {op!r} within {timeout:.0f} s")
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                continue
            finally:
                self.sock.settimeout(None)
            if not data:
                self._log.seek(0)
                log = self._log.read().decode(errors="replace")[-4000:]
                raise ZygoteError(f"the zygote process exited while starting:\n{log}")
            for msg in self._reader.feed(data):
                got = self._handle(msg)
                if got is not None and got["op"] == op:
                    return got

    # -- requests -------------------------------------------------------------------------
    def start_ranks(self, launch_id: int, per_rank_fds: list[list[int]]) -> list[int]:
        """Fork one rank per entry of ``per_rank_fds``; return their pids in rank order."""
        send_msg(self.sock, {"op": "launch", "id": launch_id, "n": len(per_rank_fds)})
        for rank, fds in enumerate(per_rank_fds):
            send_msg(self.sock, {"op": "rank", "rank": rank}, fds=fds)
        return self._wait_for("started", 60.0)["pids"]

    def settle(self) -> None:
        """Have the zygote finish its warm-up imports now; return when it has."""
        send_msg(self.sock, {"op": "settle"})
        self._wait_for("settled", START_TIMEOUT_S)

    def signal(self, pids: list[int], sig: int) -> None:
        """Send ``sig`` to the process groups of the given ranks (only those still alive)."""
        send_msg(self.sock, {"op": "signal", "pids": list(pids), "sig": int(sig)})

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout: float = 0.5) -> None:
        """Stop the zygote and every rank it still has.

        The zygote may be busy warming up an import for a second; rather than hold up a
        kernel that is shutting down, it is killed after ``timeout`` (its ranks follow it
        through their parent-death signal).
        """
        try:
            send_msg(self.sock, {"op": "shutdown"})
        except OSError:
            pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        self._log.close()


_zygote: Zygote | None = None
_lock = threading.RLock()


def pool_lock() -> threading.RLock:
    """The lock that serialises starting, using and stopping the zygote in this process.

    Read it through this function, never bind it by name: a forked child gets a new one.
    """
    return _lock


def get_zygote() -> Zygote:
    """The kernel's zygote, started (or restarted after a crash) on demand."""
    global _zygote
    if _zygote is not None and not _zygote.alive():
        _zygote.close()
        _zygote = None
    if _zygote is None:
        _zygote = Zygote()
    return _zygote


def settle() -> None:
    """Start the zygote if none runs and let it finish its warm-up imports before returning.

    The zygote imports a few modules ranks often need (``torch._dynamo`` for DDP, DTensor)
    while it has nothing else to do, a second of a core each — also while the first launch's
    ranks run. Call this before a launch whose ranks time anything (``lk.bench.calibrate``
    does): on 2 cores, a 2-rank all-gather of 8 KB measured 2–4 ms instead of 0.3 ms while the
    zygote imported beside it.
    """
    with pool_lock():
        get_zygote().settle()


def current_zygote_pid() -> int | None:
    """Pid of the warm zygote, or None when none is running."""
    return _zygote.pid if _zygote is not None and _zygote.alive() else None


def shutdown() -> None:
    """Stop labkit's warm worker process (the zygote); the next launch starts a new one."""
    global _zygote
    with pool_lock():
        if _zygote is not None:
            _zygote.close()
            _zygote = None


def _forget_in_child() -> None:
    # A process forked from the kernel (a DataLoader worker, say) must not share its zygote.
    global _zygote, _lock
    _zygote = None
    _lock = threading.RLock()


atexit.register(shutdown)
os.register_at_fork(after_in_child=_forget_in_child)
