"""Run any valid pipeline schedule over send/recv: forward, backward, activations in flight.

Introduced in notebooks/11_pipeline_parallel.ipynb.

Each rank walks its own row of the schedule, slot by slot (idle slots are skipped: a rank
simply waits in its next receive). For ``F`` of stage ``s`` on micro-batch ``i`` it takes the
micro-batch (stage 0) or receives the activation of stage ``s − 1``, runs the stage, keeps
input and output for the backward and sends the output on; the last stage computes the loss,
scaled by ``1/m`` so the sum over micro-batches is the mean over the whole batch. For ``B``
it receives the output's gradient (or starts from the loss), runs the backward — parameter
gradients accumulate over micro-batches — and sends the input's gradient back.

Why it cannot deadlock: sends are non-blocking (completed at the end of the step) and every
receive waits for an action that a valid schedule puts in an earlier slot, which itself only
waits for earlier slots. On NCCL, separate sends and receives to different peers could still
wait on each other while NCCL creates its communicators, so each action's receive is issued
together with the sends of the action before it as one ``dist.batch_isend_irecv``
(``labkit.parallel.pipeline.p2p``), and every receive waits at most ``timeout_s``. Messages
carry a tag naming the stage boundary, the micro-batch and the direction, so on gloo a
receive matches its send whatever order they travel; backends that ignore tags (NCCL) need
``messages_in_order``, which every generated schedule satisfies.

Each action is recorded as a ``lk.trace.span`` named after it (``"1F0"``, kind ``"compute"``,
with ``stage``, ``op``, ``microbatch`` arguments) and each wait for a message as a span of
kind ``"comm"``, so ``lk.trace.Timeline`` shows the measured schedule. On a GPU both kinds of
span synchronise the current stream before reading the clock (``span(..., device=...)``):
kernels return to the host once queued, and a span closed before they finish would shrink the
compute, move it into the next wait and make the measured bubble come out wrong. Each receive
blocks the host (``Work.wait(timeout)``) until its message is there, on NCCL too.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.pipeline.p2p import Exchange
from labkit.parallel.pipeline.schedules import Action, rank_of_stage
from labkit.parallel.pipeline.split import output_shapes, split_sequential
from labkit.trace import COMM, span

__all__ = [
    "PipelineResult",
    "messages_in_order",
    "output_shapes",
    "run_schedule",
    "split_sequential",
    "stages_of_rank",
]


@dataclass
class PipelineResult:
    """What one rank saw while running a schedule.

    Attributes:
        loss: the whole batch's mean loss on the rank holding the last stage, else None.
        peak_in_flight: per stage held here, the most micro-batches whose activations were
            kept at once (forward done, backward not yet).
        n_sends: messages this rank sent (activations and gradients).
    """

    loss: float | None = None
    peak_in_flight: dict[int, int] = field(default_factory=dict)
    n_sends: int = 0


def stages_of_rank(rank: int, n_ranks: int, n_stages: int) -> list[int]:
    """The stages rank ``rank`` holds under round-robin placement: ``rank, rank + p, …``.

    Args:
        rank: pipeline rank (in the pipeline's group).
        n_ranks: pipeline ranks ``p``.
        n_stages: total stages, a multiple of ``p``.

    Returns:
        list[int]: the stage indices, ascending.

    Raises:
        ValueError: ``n_stages`` is not a positive multiple of ``n_ranks``.
    """
    if n_ranks < 1 or n_stages < 1 or n_stages % n_ranks:
        raise ValueError(f"n_stages ({n_stages}) must be a positive multiple of {n_ranks=}")
    return list(range(rank, n_stages, n_ranks))


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
            if a is None:
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
_TAGGED = frozenset({"gloo", "mpi", "labkit_record", "labkit_simnet"})


def _tag(stage: int, microbatch: int, n_microbatches: int, grad: bool) -> int:
    """Tag of the message crossing the boundary after ``stage`` (activation) or before it."""
    return 2 * (stage * n_microbatches + microbatch) + int(grad)


class _Wire:
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


def run_schedule(
    schedule: Sequence[Sequence[Action | None]],
    stages: dict[int, nn.Module],
    inputs: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    shapes: Sequence[Sequence[int]],
    group: dist.ProcessGroup | None = None,
    compute_s: float = 0.0,
    timeout_s: float = 300.0,
    forward_context: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> PipelineResult:
    """Run this rank's row of ``schedule``: one training step's forwards and backwards.

    GPipe (Huang et al. 2019) and 1F1B (Narayanan et al. 2021) differ only in the schedule
    passed here. Gradients accumulate in the stages' parameters (zero them before a step);
    the result equals one backward of ``loss_fn`` over the whole batch on one process.

    Args:
        schedule: per rank of ``group``, one entry per slot; should pass ``validate``.
        stages: stage index → module, for the stages this rank holds
            (``stages_of_rank``); a stage's output feeds the next stage.
        inputs: the micro-batches (used where stage 0 lives; every rank reads their dtype
            and device for its receive buffers).
        targets: the micro-batches' targets (used where the last stage lives).
        loss_fn: ``loss_fn(output, target)``, a mean over the micro-batch.
        shapes: ``shapes[s]`` is stage ``s``'s output shape for one micro-batch
            (``output_shapes``).
        group: the pipeline's process group (default: the default group); rank ``r`` of it
            runs row ``r``.
        compute_s: extra seconds each action sleeps inside its span, emulating compute that
            is large next to communication (B = F, as in the schedules' time model).
        timeout_s: the longest any receive (or, at the end, a send) may wait; on NCCL too
            the wait blocks the host (``Work.wait(timeout)``), so a stage that never sends
            ends the step with an error instead of a hang.
        forward_context: entered around each forward and the loss (e.g. bf16 autocast,
            ``lk.precision.autocast``); the backward runs outside it, as ``torch.autocast``
            recommends. None: nothing.

    Returns:
        PipelineResult: the loss (last stage's rank), peak activations in flight per stage,
        messages sent.

    Raises:
        ValueError: the schedule's row count differs from the group size, this rank is
            missing a stage its row uses, or the backend may ignore tags (e.g. NCCL; gloo
            honours them) and the schedule receives some pair's messages out of order
            (``messages_in_order``).
        RuntimeError: a receive got no message within ``timeout_s`` (naming the action, the
            stage and rank it waited for, and the backend's error).
    """
    n_ranks = dist.get_world_size(group)
    if len(schedule) != n_ranks:
        raise ValueError(f"the schedule has {len(schedule)} rows for {n_ranks} ranks")
    if dist.get_backend(group) not in _TAGGED and not messages_in_order(schedule, len(shapes)):
        raise ValueError(
            f"backend {dist.get_backend(group)!r} may match messages in order only (NCCL "
            "ignores tags), and this schedule receives some messages out of order; use gloo"
        )
    wire = _Wire(group, n_ranks, timedelta(seconds=timeout_s))
    context = forward_context or contextlib.nullcontext
    n_stages, m = len(shapes), len(inputs)
    last = n_stages - 1
    saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    live: dict[int, int] = {}
    result = PipelineResult()
    for a in schedule[wire.me]:
        if a is None:
            continue
        if a.stage not in stages:
            raise ValueError(f"rank {wire.me} runs {a} but holds stages {sorted(stages)}")
        s, i = a.stage, a.microbatch
        if a.op == "F":
            if s == 0:
                wire.flush()
                x = inputs[i]
            else:
                x = wire.recv(inputs[i], shapes[s - 1], s - 1, _tag(s - 1, i, m, False), str(a))
                x.requires_grad_(True)
            with span(str(a), device=x.device, stage=s, op="F", microbatch=i), context():
                y = stages[s](x)
                if s == last:
                    y = loss_fn(y, targets[i]) / m  # mean over the whole batch
                _sleep(compute_s)
            saved[(s, i)] = (x, y)
            live[s] = live.get(s, 0) + 1
            result.peak_in_flight[s] = max(result.peak_in_flight.get(s, 0), live[s])
            if s < last:
                wire.send(y, s + 1, _tag(s, i, m, False))
        else:
            x, y = saved.pop((s, i))
            live[s] -= 1
            dy = None
            if s == last:
                wire.flush()
            else:
                dy = wire.recv(y, shapes[s], s + 1, _tag(s, i, m, True), str(a))
            with span(str(a), device=y.device, stage=s, op="B", microbatch=i):
                y.backward(dy)
                _sleep(compute_s)
            if s == last:
                result.loss = (result.loss or 0.0) + float(y.detach())
            if s > 0:
                wire.send(x.grad, s - 1, _tag(s - 1, i, m, True))
    wire.finish()
    result.n_sends = wire.n_sends
    return result


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)
