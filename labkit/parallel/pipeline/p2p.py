"""Send/recv between pipeline stages that is safe on NCCL: batched, bounded in time.

Introduced in notebooks/10_model_parallel.ipynb (used again in 11_pipeline_parallel.ipynb).

NCCL runs point-to-point operations on communicators it creates when they are first needed,
and creating one blocks until every rank in it joins. Separate ``isend`` / ``irecv`` calls to
different peers can therefore wait on each other in a cycle. PyTorch's answer is
``dist.batch_isend_irecv``: the operations of one step go to NCCL as one group
(``ncclGroupStart`` / ``ncclGroupEnd``), so none waits for another; on backends without
coalescing (gloo, labkit's) it issues them one after another, which is what they need.
PyTorch documents one condition: if a batch is the group's first operation, every rank of
the group must take part — so ``warm_up`` runs one all_reduce on an NCCL group before its
first batch. Every receive waits at most a timeout (``Work.wait(timeout)``); sends are
completed later (``finish``), as ``torch.distributed.pipelining`` does.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from labkit.launcher import backend_for

__all__ = ["Exchange", "warm_up"]

_warm: set[str] = set()  # names of the NCCL groups that have run their first collective


def warm_up(group: dist.ProcessGroup | None, device: torch.device) -> None:
    """Before the first batch of p2p on an NCCL group: one all_reduce that every rank joins.

    ``dist.batch_isend_irecv``'s documentation: "if this API is the first collective call in
    the group passed to dist.P2POp, all ranks of the group must participate in this API
    call". Every rank of the group calls this at the same point (the start of a step). It
    acts when the tensors go over NCCL: a CUDA device under ``"nccl"`` or a multi-device
    backend such as ``"cpu:gloo,cuda:nccl"``; otherwise it does nothing.

    Args:
        group: the stages' group (None: the default group).
        device: this rank's device (NCCL: its GPU).
    """
    if backend_for(str(dist.get_backend(group)), torch.device(device).type) != "nccl":
        return  # gloo, or CPU tensors under "cpu:gloo,cuda:nccl"
    name = (group or dist.group.WORLD).group_name
    if name not in _warm:
        dist.all_reduce(torch.zeros(1, device=device), group=group)
        _warm.add(name)


class Exchange:
    """The p2p of one rank: each step's sends and receives issued as one batch.

    Args:
        group: the stages' group (None: the default group); peers are its ranks.
        timeout: the longest a receive (and, in ``finish``, a send) may wait.
    """

    def __init__(self, group: dist.ProcessGroup | None, timeout: timedelta) -> None:
        self.group, self.timeout = group, timeout
        self.queued: list[dist.P2POp] = []  # sends waiting for the next batch
        self.pending: list[tuple[dist.Work, torch.Tensor]] = []  # issued sends (and buffers)
        self.n_batches = 0

    def send(self, t: torch.Tensor, peer: int, tag: int = 0) -> None:
        """Queue a send of ``t`` to group rank ``peer``; it goes with the next batch."""
        t = t.detach().contiguous()
        self.queued.append(dist.P2POp(dist.isend, t, group=self.group, tag=tag, group_peer=peer))

    def recv(self, buf: torch.Tensor, peer: int, tag: int = 0) -> torch.Tensor:
        """Receive into ``buf`` from ``peer``, batched with the queued sends; wait for it.

        Raises:
            RuntimeError: the message did not arrive within the timeout (the backend's
                error, e.g. gloo's "Timed out waiting ... for recv operation to complete").
        """
        self._issue([dist.P2POp(dist.irecv, buf, group=self.group, tag=tag, group_peer=peer)])
        return buf

    def flush(self) -> None:
        """Issue the queued sends now (one batch), without waiting for them."""
        if self.queued:
            self._issue([])

    def finish(self) -> None:
        """Issue what is queued and wait for every send, each at most the timeout."""
        self.flush()
        for work, _ in self.pending:
            work.wait(self.timeout)
        self.pending.clear()

    def _issue(self, recvs: Sequence[dist.P2POp]) -> None:
        ops, self.queued = [*self.queued, *recvs], []
        warm_up(self.group, ops[0].tensor.device)
        works = dist.batch_isend_irecv(ops)
        self.n_batches += 1
        if len(works) != len(ops):  # NCCL: one Work for the whole batch
            for work in works:
                work.wait(self.timeout)
            return
        for op, work in zip(ops, works, strict=True):
            if op.op is dist.irecv:
                work.wait(self.timeout)
            else:
                self.pending.append((work, op.tensor))
