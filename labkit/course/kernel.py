"""The Jupyter kernel client the course runner executes notebooks with.

Introduced in notebooks/00_setup_and_launcher.ipynb (``labkit course run`` in its summary).

It is jupyter_client's asyncio client (what nbclient and papermill use by default) with two
changes, plugged in through jupyter_client's own extension points (the kernel manager's
``client_factory``, the client's ``*_channel_class`` traits; nbclient's ``kernel_manager_class``):

1. **A shell send re-arms the shell socket** (the fix for runs that stopped for a whole cell
   timeout at a widget cell). ``Session.send`` writes on a *blocking shadow* of the client's
   ``zmq.asyncio`` socket. libzmq processes its pending commands on every send, which drains
   the socket's edge-triggered ``ZMQ_FD``; if the kernel's ``execute_reply`` has just arrived,
   its wake-up is consumed there and ``zmq.asyncio`` never hears of it, so the ``get_msg``
   waiting for the reply sleeps until its timeout (600 s for the course runner) and only then
   finds the reply. nbclient sends on the shell channel while it waits for a reply whenever a
   cell displays into an ``ipywidgets.Output`` (its ``OutputWidget`` mimic answers each output
   with a ``comm_msg``), which is what every ``lk.widgets`` explorer does; a busy machine widens
   the window. Reading ``EVENTS`` through the asyncio socket after the send makes pyzmq
   re-check the socket and wake a pending waiter (pyzmq's own remedy for edge-triggered FDs).
   The kernel-side twin of this bug is ipython/ipykernel#1529 (fixed in ipykernel 7.4.0, which
   we pin); the client side is jupyter/nbclient#312 (open; the review of its PR #311 pointed at
   jupyter_client, whose ``Session.send`` takes the shadow; jupyter/jupyter_client#1059, open,
   would drop it). No released jupyter_client re-arms the socket (8.10.0 checked). Drop
   ``rearm`` once one does: tests/test_course_kernel.py says when the upstream channel stops
   stranding replies.

2. **An idle kernel cannot hold a cell forever.** While nbclient waits for a cell's
   ``execute_reply``, the shell channel checks the kernel's state (from its IOPub ``status``
   messages) once a second. When the kernel has been idle for ``idle_timeout`` seconds and the
   reply has not come (it finished the cell and the reply was lost, or it never started the
   cell: the request was lost, as in ipython/ipykernel#1554), ``get_msg`` raises
   :class:`KernelIdleError`, which fails the notebook with that message instead of a silent
   wait until the cell timeout. A cell that is still running keeps the kernel busy and is
   never flagged. Each check ends with a real ``zmq_poll`` (pyzmq's poll timeout does one), so
   a reply whose wake-up was lost in any other way is found within a second too. (nbclient 0.11
   does not cancel its kernel-alive poller when the reply wait raises, so after such a failure
   asyncio may log "Task exception was never retrieved ... AssertionError" from
   ``_async_poll_kernel_alive``: noise from that orphaned task, not a second failure.)

benchmarks/papermill_soak.py measures both (benchmarks/RESULTS.md has the numbers).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from queue import Empty
from typing import Any

import zmq
from jupyter_client.asynchronous.client import AsyncKernelClient
from jupyter_client.channels import AsyncZMQSocketChannel
from jupyter_client.manager import AsyncKernelManager
from traitlets import Bool, Float, Type, default

# run_notebook passes its own idle_timeout (run.DEFAULT_IDLE_TIMEOUT_S, the same 60 s); this is
# the default for other users of the client. run.py imports this module, not the reverse.
DEFAULT_IDLE_TIMEOUT_S = 60.0
CHECK_INTERVAL_S = 1.0

__all__ = [
    "DEFAULT_IDLE_TIMEOUT_S",
    "IdleWatch",
    "KernelIdleError",
    "WatchedIOPubChannel",
    "WatchedKernelClient",
    "WatchedKernelManager",
    "WatchedShellChannel",
]


class KernelIdleError(TimeoutError):
    """The kernel sat idle while a cell waited for its reply.

    Raised from the shell channel's ``get_msg``; nbclient and papermill pass it on, and
    ``labkit.course.run_notebook`` reports it as the notebook's error, on the waiting cell.
    """


@dataclass
class _Request:
    sent: float
    started: float | None = None  # first IOPub message the kernel published for it
    finished: float | None = None  # its IOPub status: idle


class IdleWatch:
    """What the kernel is doing, as its IOPub messages say, and which requests await replies.

    Shared by a client's shell and IOPub channels. Only ``execute_request`` is tracked: it is
    the request nbclient waits on for a cell.

    Args:
        idle_timeout: seconds the kernel may stay idle while a request awaits its reply.
        clock: the time source (tests pass a fake one).
    """

    def __init__(self, idle_timeout: float, clock: Any = time.monotonic) -> None:
        self.idle_timeout = idle_timeout
        self.clock = clock
        self.pending: dict[str, _Request] = {}
        self.state: str | None = None  # the last execution_state on IOPub
        self.state_since = clock()

    def sent(self, msg: dict) -> None:
        """A request went out on the shell channel."""
        if msg["header"]["msg_type"] == "execute_request":
            self.pending[msg["header"]["msg_id"]] = _Request(sent=self.clock())

    def replied(self, msg: dict) -> None:
        """A reply came in on the shell channel."""
        self.pending.pop(msg.get("parent_header", {}).get("msg_id"), None)

    def published(self, msg: dict) -> None:
        """The kernel published ``msg`` on IOPub."""
        now = self.clock()
        request = self.pending.get(msg.get("parent_header", {}).get("msg_id"))
        if request is not None and request.started is None:
            request.started = now
        if msg["header"]["msg_type"] == "status":
            state = msg["content"].get("execution_state")
            if state != self.state:
                self.state, self.state_since = state, now
            if request is not None and state == "idle":
                request.finished = now

    def check(self) -> None:
        """Raise :class:`KernelIdleError` if a request has waited on an idle kernel too long."""
        if self.state == "busy":
            return  # it is working on something; a long cell is the cell timeout's business
        now = self.clock()
        for msg_id, request in self.pending.items():
            idle_for = now - max(request.sent, self.state_since)
            if request.finished is not None:
                idle_for = min(idle_for, now - request.finished)
            if idle_for < self.idle_timeout:
                continue
            if request.finished is not None:
                what = (
                    f"the kernel finished this cell {now - request.finished:.0f} s ago (its "
                    "IOPub status went idle) but the cell's execute_reply never reached the "
                    "client: the reply was lost between kernel and client"
                )
            elif request.started is not None:
                what = (
                    "the kernel started this cell, then reported itself idle without "
                    "finishing it or replying"
                )
            else:
                what = (
                    f"the kernel has been idle for {idle_for:.0f} s without starting this cell, "
                    f"sent {now - request.sent:.0f} s ago: the execute_request was lost on its "
                    "way to the kernel"
                )
            raise KernelIdleError(
                f"{what}. Stopped after idle_timeout={self.idle_timeout:g} s instead of waiting "
                f"for the cell timeout (request {msg_id}; see labkit/course/kernel.py)."
            )


class WatchedShellChannel(AsyncZMQSocketChannel):
    """The shell channel: re-arms its socket after each send; waits in checked slices."""

    watch: IdleWatch | None = None
    rearm: bool = True
    check_interval: float = CHECK_INTERVAL_S

    def send(self, msg: dict[str, Any]) -> None:
        """Send ``msg`` (jupyter_client writes it on a blocking shadow), then re-arm the socket."""
        super().send(msg)
        if self.rearm:
            # zmq.asyncio re-reads EVENTS and wakes a pending poll/recv if a message is already
            # queued: the wake-up the shadow's send consumed (module docstring, point 1).
            self.socket.get(zmq.EVENTS)
        if self.watch is not None:
            self.watch.sent(msg)

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        """The next shell message, as jupyter_client's; raises KernelIdleError (point 2)."""
        if self.watch is None or not self.check_interval:
            return await super().get_msg(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = self.check_interval
            if deadline is not None:
                wait = min(wait, max(0.0, deadline - time.monotonic()))
            # pyzmq ends a poll that timed out with a real zmq_poll, so a queued message whose
            # wake-up was lost is returned here at the latest.
            if await self.socket.poll(int(wait * 1000)):
                msg = await self._recv()
                self.watch.replied(msg)
                return msg
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty
            self.watch.check()


class WatchedIOPubChannel(AsyncZMQSocketChannel):
    """The IOPub channel: tells the watch what the kernel publishes."""

    watch: IdleWatch | None = None

    async def get_msg(self, timeout: float | None = None) -> dict[str, Any]:
        msg = await super().get_msg(timeout)
        if self.watch is not None:
            self.watch.published(msg)
        return msg


class WatchedKernelClient(AsyncKernelClient):
    """jupyter_client's async client with the shell and IOPub channels above.

    ``idle_timeout`` (seconds; 0 turns the watch off) and ``rearm`` are configurable traits.
    """

    shell_channel_class = Type(WatchedShellChannel)  # type: ignore[assignment]
    iopub_channel_class = Type(WatchedIOPubChannel)  # type: ignore[assignment]
    idle_timeout = Float(DEFAULT_IDLE_TIMEOUT_S, config=True, help="seconds; 0: no watch")
    rearm = Bool(True, config=True, help="re-arm the shell socket after each send")

    @property
    def watch(self) -> IdleWatch | None:
        if self.idle_timeout <= 0:
            return None
        if getattr(self, "_watch", None) is None:
            self._watch = IdleWatch(self.idle_timeout)
        return self._watch

    @property
    def shell_channel(self) -> Any:
        channel = super().shell_channel
        if isinstance(channel, WatchedShellChannel):
            channel.watch, channel.rearm = self.watch, self.rearm
        return channel

    @property
    def iopub_channel(self) -> Any:
        channel = super().iopub_channel
        if isinstance(channel, WatchedIOPubChannel):
            channel.watch = self.watch
        return channel


class WatchedKernelManager(AsyncKernelManager):
    """nbclient's default kernel manager, handing out :class:`WatchedKernelClient` clients."""

    @default("client_factory")
    def _watched_client_factory(self) -> type:
        return WatchedKernelClient
