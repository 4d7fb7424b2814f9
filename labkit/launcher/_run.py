"""One launch: host the store, get ranks from the zygote, relay output, collect results.

Everything happens on the calling thread in one ``select`` loop, so output reaches the cell
live, a Ctrl-C (KeyboardInterrupt) lands here, and every exit path kills what is left.
"""

from __future__ import annotations

import itertools
import os
import selectors
import signal
import socket
import time
from datetime import timedelta

import cloudpickle

from labkit.launcher._checks import Plan
from labkit.launcher._pool import Zygote
from labkit.launcher._relay import OutputRelay
from labkit.launcher._wire import FrameReader, send_msg
from labkit.launcher.errors import (
    LaunchTimeout,
    RankError,
    RankFailure,
    clean_stack_dump,
    describe_exit,
    format_remote_traceback,
)
from labkit.launcher.failure_policy import (
    EXIT_WAIT_S,
    FAILURE_GRACE_S,
    STACK_QUIET_S,
    STACK_WAIT_S,
)

_launch_ids = itertools.count(1)


class _RankIO:
    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.ctrl, ctrl_child = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stk_r, stk_w = os.pipe()
        self.child_fds = [ctrl_child.detach(), out_w, err_w, stk_w]
        self.out, self.err, self.stk = out_r, err_r, stk_r
        self.frames = FrameReader()
        self.stack = b""
        self.result: object = None
        self.has_result = False
        self.error: dict | None = None
        self.exit_code: int | None = None
        self.exited = False
        self.failed_at = float("inf")

    def close_child_ends(self) -> None:
        for fd in self.child_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.child_fds = []


class LaunchRun:
    """Runs one call of ``lk.launch`` to completion; use ``run()`` once."""

    def __init__(self, zygote: Zygote, plan: Plan, payload: bytes) -> None:
        self.zygote = zygote
        self.plan = plan
        self.payload = payload
        self.relay = OutputRelay(plan.verbose)
        self.ranks = [_RankIO(r) for r in range(plan.world_size)]
        self.sel = selectors.DefaultSelector()
        self.pids: list[int] = []
        self.id = next(_launch_ids)

    # -- set-up ---------------------------------------------------------------------------
    def _start_store(self):
        import torch.distributed as dist

        # Bind the rendezvous to loopback ourselves: TCPStore would listen on every interface.
        self.store_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.store_sock.bind(("127.0.0.1", 0))
        self.store_sock.listen(128)
        self.port = self.store_sock.getsockname()[1]
        self.store = dist.TCPStore(
            "127.0.0.1",
            self.port,
            self.plan.world_size,
            True,
            timeout=timedelta(seconds=self.plan.pg_timeout),
            wait_for_workers=False,
            master_listen_fd=self.store_sock.fileno(),
        )
        self.store_sock.detach()  # the store owns (and closes) the listening socket now

    def _call_message(self) -> dict:
        p = self.plan
        env = dict(os.environ)
        env["MPLBACKEND"] = "Agg"  # a rank has no screen and no notebook to draw into
        env.update(p.env)  # lk.launch(env=...): this launch's ranks only, never the caller
        return {
            "payload": self.payload,
            "env": env,
            "sys_path": list(__import__("sys").path),
            "cwd": os.getcwd(),
            "launcher_pid": os.getpid(),
            "local": {
                "port": self.port,
                "device": p.device,
                "threads": p.threads,
                "pg_timeout": p.pg_timeout,
                "verbose": p.verbose,
                "loopback_if": p.loopback_if,
            },
        }

    # -- the loop -------------------------------------------------------------------------
    def start_ranks(self) -> None:
        """Host the store, fork the ranks, send each the call and watch all their pipes."""
        self._start_store()
        self.pids = self.zygote.start_ranks(self.id, [r.child_fds for r in self.ranks])
        for r in self.ranks:
            r.close_child_ends()
        call = self._call_message()
        for r in self.ranks:
            try:
                send_msg(r.ctrl, call)
            except OSError:
                pass  # the rank already died; its exit is reported by the zygote
            self.sel.register(r.ctrl, selectors.EVENT_READ, ("ctrl", r))
            self.sel.register(r.out, selectors.EVENT_READ, ("out", r))
            self.sel.register(r.err, selectors.EVENT_READ, ("err", r))
            self.sel.register(r.stk, selectors.EVENT_READ, ("stk", r))
        self.sel.register(self.zygote.sock, selectors.EVENT_READ, ("zygote", None))

    def run(self) -> list:
        try:
            self.start_ranks()
            return self._supervise()
        finally:
            self.cleanup()

    def _supervise(self) -> list:
        deadline = time.monotonic() + self.plan.timeout
        first_failure_at = None
        while True:
            now = time.monotonic()
            if all(r.has_result for r in self.ranks):
                self.wait_exits(EXIT_WAIT_S)
                return [r.result for r in self.ranks]
            failed = [r for r in self.ranks if r.error or (r.exited and not r.has_result)]
            if failed and first_failure_at is None:
                first_failure_at = now
            if first_failure_at is not None and now - first_failure_at >= FAILURE_GRACE_S:
                raise self.rank_error()
            if now >= deadline:
                raise self.timeout_error()
            wait = deadline - now
            if first_failure_at is not None:
                wait = min(wait, first_failure_at + FAILURE_GRACE_S - now)
            # Wake at least 5x a second: a Ctrl-C must not wait for a long select to end.
            self.poll(min(max(0.0, wait), 0.2))

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the watched descriptors; handle each ready one."""
        for key, _ in self.sel.select(timeout):
            kind, r = key.data
            self.on_ready(key, kind, r)

    def on_ready(self, key: selectors.SelectorKey, kind: str, r: _RankIO | None) -> None:
        """Handle one ready descriptor: the zygote's socket or one of a rank's four.

        ``kind`` is ``"zygote"``, or for rank ``r`` ``"ctrl"`` (its control socket), ``"out"``,
        ``"err"`` (its output pipes) or ``"stk"`` (its stack-dump pipe). A subclass that
        watches more descriptors handles its own kinds and passes these on.
        """
        if kind == "zygote":
            self.zygote.pump()
            self.note_exits()
            return
        try:
            data = r.ctrl.recv(1 << 20) if kind == "ctrl" else os.read(key.fd, 1 << 16)
        except OSError:
            data = b""
        if not data:
            self.sel.unregister(key.fileobj)
            if kind in ("out", "err"):
                self.relay.close(r.rank, kind)
        elif kind == "ctrl":
            for msg in r.frames.feed(data):
                self._on_message(r, msg)
        elif kind == "stk":
            r.stack += data
        else:
            self.relay.feed(r.rank, kind, data)

    def _on_message(self, r: _RankIO, msg: dict) -> None:
        if msg["op"] == "result":
            r.result = cloudpickle.loads(msg["data"])
            r.has_result = True
        elif msg["op"] == "error":
            r.error = msg
            r.failed_at = time.monotonic()

    def note_exits(self) -> None:
        """Mark the ranks whose exit the zygote has reported (with their exit codes)."""
        for r, pid in zip(self.ranks, self.pids, strict=False):
            if not r.exited and pid in self.zygote.exits:
                r.exit_code = self.zygote.exits.pop(pid)
                r.exited = True
                if not r.has_result and not r.error:
                    r.failed_at = time.monotonic()

    def signal_ranks(self, pids: list[int], sig: int) -> None:
        """Signal ranks now, without waiting for the zygote.

        The zygote may be busy for a moment (warming up an import), and a stack dump must not
        wait for it: on Linux ranks are signalled directly, after checking that each pid is
        still a child of our zygote (so a recycled pid is never hit). SIGKILL goes to the
        rank's process group (whatever it started dies too) and also through the zygote;
        SIGUSR1 (dump your stack) goes to the rank alone, exactly once.
        """
        direct = os.path.exists("/proc/self/stat")
        for pid in pids if direct else ():
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if ppid != self.zygote.pid:
                continue
            try:
                if sig == signal.SIGKILL:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except OSError:
                pass
        if sig == signal.SIGKILL or not direct:
            self.zygote.signal(pids, sig)

    def _live_pids(self) -> list[int]:
        return [pid for r, pid in zip(self.ranks, self.pids, strict=False) if not r.exited]

    def _drain(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        # Until every rank pipe has reached EOF (the zygote's socket never does).
        while time.monotonic() < end and len(self.sel.get_map()) > 1:
            self.poll(min(0.05, max(0.0, end - time.monotonic())))

    def wait_exits(self, seconds: float) -> None:
        """Give live ranks ``seconds`` to exit, then SIGKILL them and wait for the zygote's word."""
        end = time.monotonic() + seconds
        while self._live_pids() and time.monotonic() < end:
            self.poll(0.05)
        if self._live_pids():
            self.signal_ranks(self._live_pids(), signal.SIGKILL)
            end = time.monotonic() + 10.0
            while self._live_pids() and time.monotonic() < end:
                self.poll(0.05)
        self._drain(0.2)  # last output lines

    # -- outcomes -------------------------------------------------------------------------
    def rank_error(self) -> RankError:
        """Stop the other ranks and describe every rank that raised or died."""
        stopped = [r.rank for r in self.ranks if not r.exited and not r.error]
        self.wait_exits(0.0)
        failures = {}
        for r in self.ranks:
            if r.error:
                failures[r.rank] = RankFailure(
                    r.rank,
                    "raised",
                    f"raised {r.error['type']}: {r.error['message']}".rstrip(": "),
                    details=format_remote_traceback(r.error),
                    exit_code=r.exit_code,
                    exc_type=r.error["type"],
                    at=r.failed_at,
                )
            elif r.exited and not r.has_result and r.rank not in stopped:
                tail = self.relay.stderr_tail(r.rank)
                failures[r.rank] = RankFailure(
                    r.rank,
                    "died",
                    describe_exit(r.exit_code),
                    details=f"last lines of its stderr:\n{tail}" if tail else "",
                    exit_code=r.exit_code,
                    at=r.failed_at,
                )
        return RankError(
            failures,
            self.plan.world_size,
            stopped,
            advice="Fix the failing rank's code and run the cell again.",
        )

    def collect_stacks(self, ranks: list[_RankIO]) -> None:
        """Ask these ranks for their Python stacks (faulthandler, SIGUSR1); wait for them.

        faulthandler writes a dump in many small pieces: wait until every rank has written
        something and then nothing more for STACK_QUIET_S (bounded by STACK_WAIT_S). Each
        dump is appended to its rank's ``stack``.
        """
        self.signal_ranks([self.pids[r.rank] for r in ranks], signal.SIGUSR1)
        now = time.monotonic()
        end, last_growth, seen = now + STACK_WAIT_S, now, 0
        while now < end:
            self.poll(0.05)
            now = time.monotonic()
            total = sum(len(r.stack) for r in ranks)
            if total != seen:
                seen, last_growth = total, now
            elif all(r.stack for r in ranks) and now - last_growth >= STACK_QUIET_S:
                break

    def timeout_error(self) -> LaunchTimeout:
        """Collect the unfinished ranks' stacks, stop every rank, say where each one was."""
        stuck = [r for r in self.ranks if not r.exited and not r.has_result]
        self.collect_stacks(stuck)
        self.wait_exits(0.0)
        failures = {
            r.rank: RankFailure(
                r.rank,
                "stuck",
                "was still running",
                stack=clean_stack_dump(r.stack.decode(errors="replace"))
                or "(no Python stack came back within the wait: the rank may not have started "
                "running Python code yet on a very busy machine)",
            )
            for r in stuck
        }
        finished = [r.rank for r in self.ranks if r.has_result]
        headline = (
            f"no result within timeout={self.plan.timeout:g} s: rank(s) "
            f"{', '.join(str(r.rank) for r in stuck)} had not finished"
            + (f" (rank(s) {', '.join(map(str, finished))} had)" if finished else "")
            + ". Where each unfinished rank was, innermost call last:"
        )
        advice = (
            "\nA rank waiting in a collective or recv that its peers never reached is a "
            "deadlock: compare the lines above. If the work is just slow, raise timeout=."
        )
        return LaunchTimeout(failures, self.plan.world_size, [], headline=headline, advice=advice)

    def cleanup(self) -> None:
        """Kill whatever rank is left and close every descriptor and the store."""
        # Runs on every path, KeyboardInterrupt included: nothing outlives the call.
        try:
            if self.pids and self._live_pids():
                self.signal_ranks(self._live_pids(), signal.SIGKILL)
                end = time.monotonic() + 10.0
                while self._live_pids() and time.monotonic() < end:
                    try:
                        self.poll(0.05)
                    except KeyboardInterrupt:
                        continue
        finally:
            self.sel.close()
            for r in self.ranks:
                r.close_child_ends()
                r.ctrl.close()
                for fd in (r.out, r.err, r.stk):
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            if hasattr(self, "store"):
                del self.store
            if hasattr(self, "store_sock"):
                self.store_sock.close()
