"""What each rank of a ``World`` runs: a loop that executes notebook cells sent by the kernel.

The rank is an ordinary ``lk.launch`` rank (forked by the warm zygote, process group already
initialised); the function it runs is ``serve``, which connects back to the kernel over a Unix
socket in a private folder and then executes each cell it receives in one namespace that lives
as long as the rank, so variables persist from cell to cell. A cell's ``print`` output and the
value of its last expression are captured and sent back with the reply, so the kernel can show
them grouped by rank; an exception is caught, formatted with the cell's own source lines, and
reported without ending the rank.

Messages (frames from ``labkit.launcher._wire``), kernel -> rank:
  {"op": "exec", "id", "code", "filename"}, {"op": "pull", "id", "name"},
  {"op": "push", "id", "values"} (cloudpickled dict), {"op": "stop"}.
rank -> kernel: {"op": "hello", "rank", "pid"} once, then one reply per request:
  {"op": "reply", "id", "rank", "stdout", "stderr", "value", "error", "data"}.
"""

from __future__ import annotations

import ast
import contextlib
import io
import linecache
import os
import signal
import socket
import traceback

from labkit.launcher._wire import recv_msg, send_msg

CELL_PREFIX = "<rank-cell-"  # file name of every cell: <rank-cell-N>


def _namespace(rank: int, world_size: int) -> dict:
    import torch
    import torch.distributed as dist

    import labkit as lk

    return {
        "__name__": "__main__",
        "__builtins__": __builtins__,
        "rank": rank,
        "world_size": world_size,
        "torch": torch,
        "dist": dist,
        "lk": lk,
    }


def _format_error(exc: BaseException) -> dict:
    te = traceback.TracebackException.from_exception(exc)
    # Start at the cell's own code: this loop's frames (and ast.parse's, for a SyntaxError,
    # whose location is in the message) are not the learner's business.
    frames = list(te.stack)
    first = next((i for i, f in enumerate(frames) if f.filename.startswith(CELL_PREFIX)), None)
    te.stack = traceback.StackSummary.from_list([] if first is None else frames[first:])
    return {
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(te.format()),
    }


def run_cell(code: str, filename: str, ns: dict) -> dict:
    """Execute ``code`` in ``ns``; return its captured output, last value and error.

    Like a notebook cell: when the last statement is an expression, its ``repr`` is returned
    as ``value`` (``None`` values are not shown).
    """
    # The cell's lines go into this rank's linecache, so tracebacks and stack dumps show them.
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    out, err = io.StringIO(), io.StringIO()
    value = error = None
    # Ctrl-C in the kernel (SIGINT from it) interrupts the cell, never the idle loop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr):
                last = ast.Expression(tree.body.pop().value)
            exec(compile(tree, filename, "exec"), ns)
            if last is not None:
                result = eval(compile(last, filename, "eval"), ns)
                if result is not None:
                    value = repr(result)
        except BaseException as exc:  # noqa: BLE001 - reported to the kernel; the rank lives on
            error = _format_error(exc)
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    return {"stdout": out.getvalue(), "stderr": err.getvalue(), "value": value, "error": error}


def _handle(msg: dict, ns: dict) -> dict:
    import cloudpickle

    op = msg["op"]
    if op == "exec":
        return run_cell(msg["code"], msg["filename"], ns)
    if op == "push":
        ns.update(cloudpickle.loads(msg["values"]))
        return {}
    if op == "pull":
        name = msg["name"]
        if name not in ns:
            err = NameError(f"name {name!r} is not defined on rank {ns['rank']}")
            return {"error": _format_error(err)}
        try:
            return {"data": cloudpickle.dumps(ns[name])}
        except Exception as exc:  # noqa: BLE001
            return {"error": _format_error(exc)}
    raise ValueError(f"unknown request {op!r}")


def serve(rank: int, world_size: int, address: str) -> None:
    """Serve cells from the kernel until it says stop or goes away (runs inside a rank).

    Args:
        rank: this rank (given by the launcher).
        world_size: number of ranks (given by the launcher).
        address: path of the kernel's Unix socket.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    ns = _namespace(rank, world_size)
    send_msg(sock, {"op": "hello", "rank": rank, "pid": os.getpid()})
    while True:
        try:
            msg, _ = recv_msg(sock)
        except (EOFError, OSError):
            return  # the kernel went away: end quietly (the launcher kills us anyway)
        if msg["op"] == "stop":
            return
        reply = {"op": "reply", "id": msg["id"], "rank": rank}
        reply.update(_handle(msg, ns))
        send_msg(sock, reply)
