"""Messages between pipeline stages: tags, NCCL's in-order matching, and the wire itself.

Introduced in notebooks/11_pipeline_parallel.ipynb.

The runtime (``run_schedule``) sends each activation forward and each input gradient back as
one tagged message. A tag names the stage boundary, the micro-batch and the direction, so on
gloo a receive matches its send whatever order they travel; backends that ignore tags (NCCL)
match them in order between two ranks, which ``messages_in_order`` checks on a schedule. ``W``
actions (zero-bubble schedules) send nothing. ``Wire`` queues each send and issues it with
the next receive as one ``dist.batch_isend_irecv`` (``labkit.parallel.pipeline.p2p``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from labkit.parallel.pipeline.p2p import Exchange
from labkit.parallel.pipeline.schedules import Action, rank_of_stage
from labkit.trace import COMM, span

__all__ = ["TAGGED_BACKENDS", "Wire", "message_tag", "messages_in_order"]


def messages_in_order(schedule: Sequence[Sequence[Action | None]], n_stages: int) -> bool:
    """Whether, between every pair of ranks, messages are received in the order they are sent.

    gloo matches a receive to its send by tag, so any valid schedule runs on it; NCCL ignores
    tags and matches sends and receives between two ranks in order, so it needs this. Every
    generator in ``labkit.parallel.pipeline.schedules`` produces such schedules.

    Args:
        schedule: per rank, one entry per slot.
        n_stages: total stages (virtual stages included).

    Returns:
        bool: True when each (sender, receiver) pair's send order equals its receive order.
    """
    p = len(schedule)
    sent: dict[tuple[int, int], list[tuple[int, int, bool]]] = {}
    received: dict[tuple[int, int], list[tuple[int, int, bool]]] = {}
    for r, row in enumerate(schedule):
        for a in row:
            if a is None or a.op == "W":  # a weight gradient stays on its rank
                continue
            s, i, fwd = a.stage, a.microbatch, a.op == "F"
            src, dst = (s - 1, s + 1) if fwd else (s + 1, s - 1)  # stage in, stage out
            if 0 <= src < n_stages and src % p != r:
                received.setdefault((src % p, r), []).append((min(s, src), i, not fwd))
            if 0 <= dst < n_stages and dst % p != r:
                sent.setdefault((r, dst % p), []).append((min(s, dst), i, not fwd))
    return sent == received


# Backends that match a receive to its send by tag (labkit's wrappers pass tags on to their
# inner backend, gloo unless LABKIT_RECORD_INNER / the simnet spec says otherwise).
TAGGED_BACKENDS = frozenset({"gloo", "mpi", "labkit_record", "labkit_simnet"})


def message_tag(stage: int, microbatch: int, n_microbatches: int, grad: bool) -> int:
    """Tag of the message crossing the boundary after ``stage``: its activation or gradient.

    Args:
        stage: the stage on the sending side of the boundary for an activation (the receiving
            side for a gradient): the boundary lies between ``stage`` and ``stage + 1``.
        microbatch: the micro-batch.
        n_microbatches: micro-batches per step ``m``.
        grad: True for the gradient travelling back, False for the activation.

    Returns:
        int: ``2(stage·m + microbatch) + grad``, unique per message of a step.
    """
    return 2 * (stage * n_microbatches + microbatch) + int(grad)


class Wire:
    """Send/recv between stages in a group; a stage's neighbour on the same rank is local.

    A send is queued and issued with the next action's receive as one
    ``dist.batch_isend_irecv`` (``labkit.parallel.pipeline.p2p.Exchange``), or on its own
    when that action receives nothing, so that no step's send and receive wait on each other
    on NCCL; every receive waits at most ``timeout``.
    """

    def __init__(self, group: dist.ProcessGroup | None, n_ranks: int, timeout: timedelta):
        self.n_ranks = n_ranks
        self.me = dist.get_rank(group)
        self.local: dict[int, torch.Tensor] = {}
        self.ex = Exchange(group, timeout)
        self.n_sends = 0

    def send(self, t: torch.Tensor, to_stage: int, tag: int) -> None:
        dst = rank_of_stage(to_stage, self.n_ranks)
        t = t.detach().contiguous()
        if dst == self.me:
            self.local[tag] = t
            return
        self.ex.send(t, dst, tag)
        self.n_sends += 1

    def recv(self, like: torch.Tensor, shape: Sequence[int], from_stage: int, tag: int, what: str):
        src = rank_of_stage(from_stage, self.n_ranks)
        if src == self.me:
            self.ex.flush()
            return self.local.pop(tag)
        buf = torch.empty(tuple(shape), dtype=like.dtype, device=like.device)
        with span("recv", kind=COMM, device=buf.device, peer=src, tag=tag):
            try:
                self.ex.recv(buf, src, tag)
            except RuntimeError as exc:
                raise RuntimeError(
                    f"pipeline rank {self.me}, action {what}: no message from stage "
                    f"{from_stage} (rank {src}, tag {tag}) within "
                    f"{self.ex.timeout.total_seconds():g} s (timeout_s); the backend said: {exc}"
                ) from exc
        return buf

    def flush(self) -> None:
        """Issue queued sends now: the next action receives nothing."""
        self.ex.flush()

    def finish(self) -> None:
        self.ex.finish()
