"""The zygote: a single-threaded process that has imported torch once and forks the ranks.

Started by the launcher as ``python -m labkit.launcher._zygote SOCKET_FD LAUNCHER_PID``.
Forking from here is safe where forking the notebook kernel is not: this process never runs a
tensor op (so no OpenMP pool exists to freeze in the children) and never touches CUDA (so
the ranks may initialise it themselves). Each rank therefore starts in milliseconds instead of
re-importing torch for seconds.

Protocol (frames from ``_wire``), launcher -> zygote:
  {"op": "launch", "id", "n"} followed by n frames {"op": "rank", "rank"} carrying 4 fds each
  (control socket, stdout pipe, stderr pipe, stack-dump pipe);
  {"op": "signal", "pids", "sig"}; {"op": "settle"} (finish the warm-up imports now);
  {"op": "shutdown"}.
zygote -> launcher: {"op": "ready"}, {"op": "started", "id", "pids"}, {"op": "exit", "pid", "code"},
  {"op": "settled"}.
The zygote reaps every rank and reports its exit code (negative: killed by that signal).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _fork_rank(
    sock: socket.socket,
    wake_fds: tuple[int, int],
    rank: int,
    n: int,
    launch_id: int,
    fds: list[int],
    others: list[int],
) -> int:
    pid = os.fork()
    if pid:
        try:
            os.setpgid(pid, pid)  # also done in the child; whoever runs first wins the race
        except OSError:
            pass
        return pid
    code = 70
    try:
        # First thing: stack-dump requests now reach this rank's pipe, even before
        # _rank.main registers its own handler (a timeout can come that early under load).
        if _STACK_FD is not None:
            os.dup2(fds[3], _STACK_FD)
        os.setpgid(0, 0)  # own process group: killpg reaches anything the rank starts
        set_parent_death_signal()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sock.close()
        for fd in (*wake_fds, *others):
            os.close(fd)
        from labkit.launcher import _rank

        code = _rank.main(rank, n, launch_id, *fds)
    except BaseException:  # noqa: BLE001 - a forked child must never return into the zygote
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


_STACK_FD: int | None = None  # where an inherited faulthandler writes on SIGUSR1


def _register_stack_dumps() -> None:
    """Register faulthandler for SIGUSR1 here, so every forked rank inherits it at birth."""
    global _STACK_FD
    import faulthandler

    _STACK_FD = os.open(os.devnull, os.O_WRONLY)
    faulthandler.register(signal.SIGUSR1, file=_STACK_FD, all_threads=True)


def _send(sock: socket.socket, msg: dict) -> None:
    from labkit.launcher._wire import send_msg

    try:
        send_msg(sock, msg)
    except OSError:
        pass  # launcher gone: the EOF on the next read ends the loop


# Imported while the zygote is idle, after it reported ready, so a rank that needs them does not
# pay ~1.2 s each, every launch: DDP's first use imports torch._dynamo, and cloudpickle makes a
# rank import torch.distributed.tensor whenever the function's code names ``tensor``. Each import
# is a core for a second: ranks that time their calls meanwhile (a calibration, a benchmark) share
# the cores with it, so those ask for them first ("settle", ``lk.launcher.settle``).
WARM_IMPORTS = ("torch.distributed.tensor", "torch._dynamo", "torch.nn.parallel")
WARM_IDLE_S = 0.5


def _warm_import(name: str) -> None:
    import gc
    import importlib

    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - a warm-up is an optimisation, never a failure
        return
    gc.freeze()  # keep the new objects out of the ranks' collections too


def serve(sock: socket.socket) -> None:
    """Fork ranks on request, reap them, report their exits; return when the launcher leaves."""
    from labkit.launcher._wire import recv_msg

    live: set[int] = set()
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    def reap() -> None:
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            live.discard(pid)
            _send(sock, {"op": "exit", "pid": pid, "code": os.waitstatus_to_exitcode(status)})

    def kill(pids, sig) -> None:
        for pid in pids:
            if pid in live:  # never signal a pid we have already reaped (it may be reused)
                try:
                    # A stack-dump request is for the rank alone; a kill is for its whole group.
                    if sig == signal.SIGKILL:
                        os.killpg(pid, sig)
                    else:
                        os.kill(pid, sig)
                except OSError:
                    try:
                        os.kill(pid, sig)
                    except OSError:
                        pass

    _send(sock, {"op": "ready", "pid": os.getpid()})
    warm = list(WARM_IMPORTS)
    while True:
        try:
            # While modules remain to warm up, only peek; import one when nothing is asked.
            # (after WARM_IDLE_S of quiet, so the launch that follows "ready" is not delayed).
            ready, _, _ = select.select([sock, wake_r], [], [], WARM_IDLE_S if warm else None)
        except InterruptedError:
            continue
        if not ready and warm:
            _warm_import(warm.pop(0))
            continue
        if wake_r in ready:
            try:
                while os.read(wake_r, 512):
                    pass
            except BlockingIOError:
                pass
        reap()
        if sock not in ready:
            continue
        try:
            msg, _ = recv_msg(sock)
        except (EOFError, OSError):
            msg = {"op": "shutdown"}
        op = msg["op"]
        if op == "launch":
            per_rank = []
            for _ in range(msg["n"]):
                _, fds = recv_msg(sock, max_fds=4)
                per_rank.append(fds)
            all_fds = [fd for fds in per_rank for fd in fds]
            pids = []
            for rank, fds in enumerate(per_rank):
                others = [fd for fd in all_fds if fd not in fds]
                pids.append(
                    _fork_rank(sock, (wake_r, wake_w), rank, msg["n"], msg["id"], fds, others)
                )
                live.add(pids[-1])
            for fd in all_fds:
                os.close(fd)
            _send(sock, {"op": "started", "id": msg["id"], "pids": pids})
        elif op == "signal":
            kill(msg["pids"], msg["sig"])
        elif op == "settle":
            while warm:
                _warm_import(warm.pop(0))
            _send(sock, {"op": "settled"})
        elif op == "shutdown":
            kill(list(live), signal.SIGKILL)
            while live:
                try:
                    pid, _ = os.waitpid(-1, 0)
                except ChildProcessError:
                    break
                live.discard(pid)
            return


def main() -> None:
    fd, launcher_pid = int(sys.argv[1]), int(sys.argv[2])
    set_parent_death_signal()  # the kernel dies -> the zygote dies -> its ranks die
    if os.getppid() != launcher_pid:
        return  # the launcher died before we could register for its death
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the launcher
    sock = socket.socket(fileno=fd)
    # The point of this process: pay for these imports once, not once per rank per launch.
    import cloudpickle  # noqa: F401
    import torch  # noqa: F401
    import torch.distributed  # noqa: F401

    import labkit.launcher._rank  # noqa: F401

    try:
        import setproctitle

        setproctitle.setproctitle(f"labkit zygote (launcher pid {launcher_pid})")
    except ImportError:
        pass
    _register_stack_dumps()
    # Move everything imported so far out of the collector's sight: ranks then neither scan
    # torch's objects in gc.collect() (~0.9 s) nor copy their pages by touching them.
    import gc

    gc.collect()
    gc.freeze()
    serve(sock)


if __name__ == "__main__":
    main()
