"""The course runner's kernel client (labkit/course/kernel.py): no stranded replies, no idle waits.

    .venv/bin/python -m pytest tests/test_course_kernel.py

The socket tests play the kernel with plain zmq sockets in the test process (a ROUTER for the
shell channel, a PUB for IOPub) and drive jupyter_client's channels against them, so the order
of events is the test's to choose. The last tests run real kernels on fixture notebooks that
lose a reply (``lost_reply``) or a request (``lost_request``) on purpose.
"""

from __future__ import annotations

import asyncio
import json
import time
import tomllib
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.session import Session

from labkit.course import run_notebook
from labkit.course.kernel import (
    DEFAULT_IDLE_TIMEOUT_S,
    IdleWatch,
    KernelIdleError,
    WatchedIOPubChannel,
    WatchedKernelClient,
    WatchedKernelManager,
    WatchedShellChannel,
)
from labkit.course.readback import read_executed
from labkit.course.run import DEFAULT_IDLE_TIMEOUT_S as RUN_IDLE_TIMEOUT_S

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "notebooks"


class FakeKernel:
    """A kernel's shell ROUTER and IOPub PUB, and a client's channels connected to them."""

    def __init__(self, shell_class: type = WatchedShellChannel, watch: IdleWatch | None = None):
        self.session = Session(key=b"test")
        self.ctx, self.actx = zmq.Context(), zmq.asyncio.Context()
        self.shell = self.ctx.socket(zmq.ROUTER)
        self.iopub = self.ctx.socket(zmq.PUB)
        shell_port = self.shell.bind_to_random_port("tcp://127.0.0.1")
        iopub_port = self.iopub.bind_to_random_port("tcp://127.0.0.1")
        dealer = self.actx.socket(zmq.DEALER)
        dealer.connect(f"tcp://127.0.0.1:{shell_port}")
        sub = self.actx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{iopub_port}")
        self.client_shell = shell_class(dealer, self.session)
        self.client_iopub = WatchedIOPubChannel(sub, self.session)
        if isinstance(self.client_shell, WatchedShellChannel):
            self.client_shell.watch = watch
            self.client_shell.check_interval = 0.05
        self.client_iopub.watch = watch

    async def connect_iopub(self) -> None:
        """Publish until the subscriber hears (a SUB misses what precedes its connection)."""
        while True:
            self.session.send(self.iopub, "status", {"execution_state": "idle"})
            try:
                await self.client_iopub.get_msg(timeout=0.05)
                return
            except Exception:  # noqa: BLE001 - queue.Empty: not connected yet
                continue

    def execute(self) -> tuple[list, dict]:
        """The client sends an execute_request; the kernel reads it."""
        self.client_shell.send(self.session.msg("execute_request", {"code": "1"}))
        frames = self.shell.recv_multipart()
        idents, rest = self.session.feed_identities(frames)
        return idents, self.session.deserialize(rest)

    def reply(self, idents: list, request: dict) -> None:
        self.session.send(
            self.shell, "execute_reply", {"status": "ok"}, parent=request, ident=idents
        )

    def publish_status(self, request: dict, state: str) -> None:
        self.session.send(self.iopub, "status", {"execution_state": state}, parent=request)

    def close(self) -> None:
        self.client_shell.close()
        self.client_iopub.close()
        self.actx.destroy(linger=0)
        self.ctx.destroy(linger=0)


async def _reply_delay_after_a_shell_send(shell_class: type) -> float:
    """Seconds a waiting ``get_msg`` takes to return a reply that came in before a shell send.

    nbclient's situation at a widget cell: it waits for the execute_reply; the reply arrives;
    before the event loop polls again, nbclient answers an Output widget with a comm_msg.
    """
    kernel = FakeKernel(shell_class)
    try:
        idents, request = kernel.execute()
        waiter = asyncio.ensure_future(kernel.client_shell.get_msg(timeout=3.0))
        await asyncio.sleep(0.05)  # the waiter is registered on the socket's fd
        kernel.reply(idents, request)
        time.sleep(0.3)  # the reply reaches the client's socket while the loop is busy
        kernel.client_shell.send(kernel.session.msg("comm_msg", {"comm_id": "w", "data": {}}))
        start = time.monotonic()
        reply = await waiter
        assert reply["msg_type"] == "execute_reply"
        return time.monotonic() - start
    finally:
        kernel.close()


def test_upstream_shell_send_strands_a_queued_reply() -> None:
    # jupyter_client's channel: the shadow socket's send consumes the reply's wake-up and the
    # reply is found only when the wait times out. If this fails, a jupyter_client release
    # re-arms the socket itself: kernel.py's re-arm can go (see its docstring).
    delays = [asyncio.run(_reply_delay_after_a_shell_send(AsyncZMQSocketChannel)) for _ in "ab"]
    assert max(delays) > 2.0, f"upstream no longer strands the reply: {delays}"


def test_shell_send_rearms_the_socket() -> None:
    # The same sequence with labkit's channel (its idle watch off: no periodic polls).
    for _ in range(3):
        delay = asyncio.run(_reply_delay_after_a_shell_send(WatchedShellChannel))
        assert delay < 0.5, f"the reply waited {delay:.2f} s after a shell send"


# -- the idle watch, on a fake clock -----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _msg(msg_type: str, msg_id: str, parent: str | None = None, **content) -> dict:
    return {
        "header": {"msg_type": msg_type, "msg_id": msg_id},
        "parent_header": {"msg_id": parent} if parent else {},
        "content": content,
    }


def _status(state: str, parent: str | None = None) -> dict:
    return _msg("status", f"s-{state}", parent, execution_state=state)


def test_watch_flags_a_reply_lost_after_the_cell_finished() -> None:
    clock = Clock()
    watch = IdleWatch(30.0, clock)
    watch.published(_status("idle"))
    watch.sent(_msg("execute_request", "r1"))
    clock.now += 0.1
    watch.published(_status("busy", "r1"))
    clock.now += 50  # a long cell: busy, never flagged
    watch.check()
    watch.published(_status("idle", "r1"))
    clock.now += 29.9
    watch.check()  # within idle_timeout
    clock.now += 0.2
    with pytest.raises(KernelIdleError, match="finished this cell 30 s ago.*execute_reply never"):
        watch.check()
    watch.replied(_msg("execute_reply", "x", "r1"))  # a reply clears it
    watch.check()


def test_watch_flags_a_request_the_kernel_never_started() -> None:
    clock = Clock()
    watch = IdleWatch(10.0, clock)
    watch.published(_status("idle"))
    clock.now += 500  # idle long before the request: counts from the request
    watch.sent(_msg("execute_request", "r1"))
    watch.sent(_msg("comm_msg", "c1"))  # only execute requests are tracked
    assert list(watch.pending) == ["r1"]
    clock.now += 9
    watch.check()
    clock.now += 2
    with pytest.raises(KernelIdleError, match="idle for 11 s without starting this cell"):
        watch.check()


def test_watch_waits_while_the_kernel_is_busy_with_something_else() -> None:
    clock = Clock()
    watch = IdleWatch(10.0, clock)
    watch.published(_status("busy", "other"))  # e.g. a comm message from a widget
    watch.sent(_msg("execute_request", "r1"))
    clock.now += 100
    watch.check()
    watch.published(_status("idle", "other"))
    clock.now += 9
    watch.check()  # the idle time counts from when the kernel went idle
    clock.now += 2
    with pytest.raises(KernelIdleError):
        watch.check()


# -- the watch on sockets ----------------------------------------------------------------------


async def _run_cell(kernel_does: str, timeout: float) -> tuple[str, float]:
    """One cell against the fake kernel, with nbclient's two waits (IOPub and shell)."""
    watch = IdleWatch(0.5)
    kernel = FakeKernel(WatchedShellChannel, watch)

    async def read_iopub() -> None:
        while True:
            await kernel.client_iopub.get_msg()

    try:
        await kernel.connect_iopub()
        reader = asyncio.ensure_future(read_iopub())
        idents, request = kernel.execute()
        kernel.publish_status(request, "busy")
        if kernel_does == "finish, reply late":
            kernel.publish_status(request, "idle")
            asyncio.get_running_loop().call_later(0.3, kernel.reply, idents, request)
        elif kernel_does == "finish, no reply":
            kernel.publish_status(request, "idle")
        start = time.monotonic()
        try:
            msg = await kernel.client_shell.get_msg(timeout=timeout)
            outcome = msg["msg_type"]
        except KernelIdleError as exc:
            outcome = f"KernelIdleError: {exc}"
        except Exception as exc:  # noqa: BLE001 - queue.Empty
            outcome = type(exc).__name__
        reader.cancel()
        return outcome, time.monotonic() - start
    finally:
        kernel.close()


def test_get_msg_fails_fast_when_the_reply_never_comes() -> None:
    outcome, seconds = asyncio.run(_run_cell("finish, no reply", timeout=30))
    assert outcome.startswith("KernelIdleError: the kernel finished this cell"), outcome
    assert 0.5 <= seconds < 5


def test_get_msg_returns_a_reply_that_comes_within_the_idle_timeout() -> None:
    outcome, seconds = asyncio.run(_run_cell("finish, reply late", timeout=30))
    assert outcome == "execute_reply" and seconds < 5


def test_get_msg_leaves_a_busy_kernel_to_the_cell_timeout() -> None:
    outcome, seconds = asyncio.run(_run_cell("stay busy", timeout=1.5))
    assert outcome == "Empty" and 1.5 <= seconds < 5


def test_client_wiring() -> None:
    assert DEFAULT_IDLE_TIMEOUT_S == RUN_IDLE_TIMEOUT_S
    km = WatchedKernelManager()
    assert km.client_factory is WatchedKernelClient
    client = WatchedKernelClient(idle_timeout=0)
    assert client.watch is None  # 0 turns the watch off
    assert WatchedKernelClient.shell_channel_class.default_value is WatchedShellChannel


# -- real kernels --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "cell", "words"),
    [
        ("lost_reply", 1, "finished this cell"),
        ("lost_request", 2, "without starting this cell"),
    ],
)
def test_run_notebook_fails_a_cell_the_idle_kernel_holds(
    tmp_path: Path, name: str, cell: int, words: str
) -> None:
    result = run_notebook(FIXTURES / f"{name}.ipynb", tmp_path, idle_timeout=3)
    assert result.status == "failed"
    err = result.error
    assert err is not None and err.ename == "KernelIdleError", err
    assert words in err.evalue and "idle_timeout=3 s" in err.evalue
    assert err.cell_index == cell
    assert result.seconds < 60  # not the 600 s cell timeout


def test_readback_blames_the_last_cell_papermill_started() -> None:
    # After a non-cell error (a timeout, a lost reply) papermill marks the cells it never
    # reached "completed", without a start time.
    started = [{"status": "completed", "start_time": "t"}] * 2
    cells = [
        {"cell_type": "code", "metadata": {"papermill": pm}}
        for pm in [*started, {"status": "completed", "start_time": None}]
    ]
    assert read_executed({"cells": cells}).last_started == 1


def test_notebook_tests_time_out_before_pytest_does() -> None:
    # A stuck cell must fail with the runner's message, not be killed by pytest-timeout: the
    # idle watch catches a lost message within a minute, the cell timeout a cell that never
    # ends, with half the test's time left for the rest of the notebook.
    from tests.conftest import NBVAL_CELL_TIMEOUT_S
    from tests.test_notebooks import NOTEBOOK_CELL_TIMEOUT_S

    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    pytest_timeout = options["ini_options"]["timeout"]
    for cell_timeout in (NOTEBOOK_CELL_TIMEOUT_S, NBVAL_CELL_TIMEOUT_S):
        assert RUN_IDLE_TIMEOUT_S < cell_timeout <= pytest_timeout / 2


# -- benchmarks/papermill_soak.py --------------------------------------------------------------


def _soak_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("soak", ROOT / "benchmarks/papermill_soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_reads_stalls_from_a_trace(tmp_path: Path) -> None:
    soak = _soak_module()
    rows = [
        {"t": 10.0, "dir": "send", "ch": "shell", "type": "execute_request", "date": 10.0},
        {"t": 10.2, "dir": "recv", "ch": "iopub", "type": "status", "date": 10.1},
        {"t": 70.0, "dir": "recv", "ch": "shell", "type": "execute_reply", "date": 10.1},
        {"t": 71.0, "dir": "recv", "ch": "shell", "type": "kernel_info_reply", "date": 70.99},
    ]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    worst, late = soak.stalls(trace)
    assert round(worst, 1) == 59.9
    assert [r["type"] for r in late] == ["execute_reply"]


def test_soak_minimal_notebooks(tmp_path: Path) -> None:
    import nbformat

    soak = _soak_module()
    for kind, widget in (("launch-widget", True), ("launch", False), ("widget", True)):
        nb = nbformat.read(soak.minimal_notebook(kind, tmp_path), as_version=4)
        code = "\n".join(c.source for c in nb.cells)
        assert ("planner_explorer" in code) == widget
        assert ("lk.launch(" in code) == kind.startswith("launch")
        assert nb.cells[1].metadata["tags"] == ["parameters"]
