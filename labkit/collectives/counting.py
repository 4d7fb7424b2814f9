"""Point-to-point messages that count themselves: the ``P2P`` wrapper and ``count_messages``.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

Every algorithm in ``labkit.collectives`` moves data only through a ``P2P`` object, which
calls ``dist.send/recv/isend/irecv`` on its group and records each message (direction, peer,
elements, bytes, and the phase and step of the algorithm it belongs to) into every
``CommStats`` opened by ``count_messages()`` on this rank. Each rank is its own process, so
the counts are per rank; return them from the ranks to compare them with the formulas in
``labkit.collectives.expected``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

__all__ = ["CommStats", "Message", "P2P", "count_messages"]

_active: ContextVar[tuple[CommStats, ...]] = ContextVar("labkit_comm_stats", default=())


@dataclass(frozen=True)
class Message:
    """One message as seen by one rank (``peer`` is a rank of the group, not a global rank)."""

    direction: str  # "send" or "recv"
    peer: int
    numel: int
    nbytes: int
    phase: str  # e.g. "reduce-scatter"
    step: int  # step within the phase, 0-based


@dataclass
class CommStats:
    """The messages one rank sent and received inside a ``count_messages()`` block."""

    rank: int = -1  # group rank of the P2P that recorded first; -1 until a message is seen
    world_size: int = 0
    messages: list[Message] = field(default_factory=list)

    def _of(self, direction: str) -> list[Message]:
        return [m for m in self.messages if m.direction == direction]

    @property
    def messages_sent(self) -> int:
        return len(self._of("send"))

    @property
    def messages_received(self) -> int:
        return len(self._of("recv"))

    @property
    def bytes_sent(self) -> int:
        return sum(m.nbytes for m in self._of("send"))

    @property
    def bytes_received(self) -> int:
        return sum(m.nbytes for m in self._of("recv"))

    def summary(self) -> dict[str, int]:
        """The four totals as a plain dict (handy to return from a rank or to print).

        Returns:
            ``{"messages_sent", "messages_received", "bytes_sent", "bytes_received"}``.
        """
        return {
            "messages_sent": self.messages_sent,
            "messages_received": self.messages_received,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
        }


@contextmanager
def count_messages() -> Iterator[CommStats]:
    """Record every message a ``P2P`` object sends or receives on this rank inside the block.

    Blocks nest: an outer block also sees the messages of an inner one.

    Returns:
        A context manager yielding the ``CommStats`` that fills up while the block runs.

    Raises:
        Nothing of its own; exceptions from the block propagate.

    Example::

        with lk.collectives.count_messages() as stats:
            lk.collectives.allreduce_ring(t)
        stats.messages_sent  # 2 * (world_size - 1)
    """
    stats = CommStats()
    token = _active.set(_active.get() + (stats,))
    try:
        yield stats
    finally:
        _active.reset(token)


class P2P:
    """Send and receive tensors between ranks of ``group``, recording every message.

    Peers are group ranks (``group_dst`` / ``group_src`` in ``torch.distributed``), so the
    algorithms built on it work on any subgroup. ``at(phase, step)`` labels the messages that
    follow, which the counts and the message diagrams of ``lk.viz`` use.

    Args:
        group: the process group (default: the default group).

    Raises:
        ValueError: this process is not a member of ``group``.
    """

    def __init__(self, group: dist.ProcessGroup | None = None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError("this rank is not a member of the group it was asked to use")
        self.world_size = dist.get_world_size(group)
        self.phase = ""
        self.step = 0

    def at(self, phase: str, step: int = 0) -> P2P:
        """Label the messages that follow with ``phase`` and ``step``; returns ``self``."""
        self.phase, self.step = phase, step
        return self

    def _record(self, direction: str, peer: int, tensor: torch.Tensor) -> None:
        msg = Message(
            direction,
            peer,
            tensor.numel(),
            tensor.numel() * tensor.element_size(),
            self.phase,
            self.step,
        )
        for stats in _active.get():
            if stats.rank < 0:
                stats.rank, stats.world_size = self.rank, self.world_size
            stats.messages.append(msg)

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        """Blocking send of ``tensor`` to group rank ``dst``."""
        self._record("send", dst, tensor)
        dist.send(tensor, group=self.group, group_dst=dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        """Blocking receive into ``tensor`` from group rank ``src``."""
        dist.recv(tensor, group=self.group, group_src=src)
        self._record("recv", src, tensor)

    def isend(self, tensor: torch.Tensor, dst: int) -> dist.Work:
        """Start sending ``tensor`` to group rank ``dst``; ``wait()`` on the result."""
        self._record("send", dst, tensor)
        return dist.isend(tensor, group=self.group, group_dst=dst)

    def irecv(self, tensor: torch.Tensor, src: int) -> dist.Work:
        """Start receiving into ``tensor`` from group rank ``src``; ``wait()`` on the result."""
        self._record("recv", src, tensor)
        return dist.irecv(tensor, group=self.group, group_src=src)

    def start(
        self,
        sends: list[tuple[torch.Tensor, int]],
        recvs: list[tuple[torch.Tensor, int]],
    ) -> list[dist.Work]:
        """Start one step's sends and receives as one ``dist.batch_isend_irecv`` call.

        gloo (and labkit's backends) start the operations one after another; NCCL coalesces
        them into one group call. That matters on NCCL, which creates the two-rank
        communicator of a peer pair lazily, blocking until the peer joins: issued as separate
        operations, ``irecv(left)`` then ``isend(right)`` on p ≥ 3 ranks would leave every rank
        waiting on a different pair, a cycle (``batch_isend_irecv``'s documentation in
        ``torch/distributed/distributed_c10d.py``; NCCL's ``ncclGroupStart``/``End``).

        Args:
            sends: ``(tensor, dst)`` pairs, ``dst`` a group rank.
            recvs: ``(tensor, src)`` pairs, ``src`` a group rank.

        Returns:
            The ``Work`` objects, in the order sends then receives; ``wait()`` on each.

        Raises:
            RuntimeError: from ``torch.distributed`` (e.g. a peer outside the group).
        """
        for tensor, dst in sends:
            self._record("send", dst, tensor)
        for tensor, src in recvs:
            self._record("recv", src, tensor)
        ops = [dist.P2POp(dist.isend, t, group=self.group, group_peer=d) for t, d in sends]
        ops += [dist.P2POp(dist.irecv, t, group=self.group, group_peer=s) for t, s in recvs]
        return dist.batch_isend_irecv(ops) if ops else []

    def exchange(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """Send ``send`` to ``dst`` while receiving ``recv`` from ``src``, then wait for both.

        Both directions are in flight at once, issued as one batch (``start``), so a ring or
        a pair of ranks that all call ``exchange`` together cannot deadlock the way two
        blocking sends can, on gloo or on NCCL.
        """
        for work in self.start([(send, dst)], [(recv, src)]):
            work.wait()
