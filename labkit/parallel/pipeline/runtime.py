"""Run any valid pipeline schedule over send/recv: forward, backward, activations in flight.

Introduced in notebooks/11_pipeline_parallel.ipynb.

Each rank walks its own row of the schedule, slot by slot (idle slots are skipped: a rank
simply waits in its next receive). For ``F`` of stage ``s`` on micro-batch ``i`` it takes the
micro-batch (stage 0) or receives the activation of stage ``s − 1``, runs the stage, keeps
input and output for the backward and sends the output on; the last stage computes the loss,
scaled by ``1/m`` so the sum over micro-batches is the mean over the whole batch. For ``B``
it receives the output's gradient (or starts from the loss), runs the backward — parameter
gradients accumulate over micro-batches — and sends the input's gradient back. In a schedule
with ``W`` actions (zero bubble, Qi et al. 2023) ``B`` computes the input's gradient only and
``W`` the weights' later (``labkit.parallel.pipeline.split_backward``: how, and the memory a
micro-batch holds from its B to its W).

Why it cannot deadlock: sends are non-blocking (completed at the end of the step) and every
receive waits for an action that a valid schedule puts in an earlier slot, which itself only
waits for earlier slots. On NCCL, separate sends and receives to different peers could still
wait on each other while NCCL creates its communicators, so each action's receive is issued
together with the sends of the action before it as one ``dist.batch_isend_irecv``
(``labkit.parallel.pipeline.p2p``), and every receive waits at most ``timeout_s``. Messages
carry a tag naming the stage boundary, the micro-batch and the direction, so on gloo a
receive matches its send whatever order they travel; backends that ignore tags (NCCL) need
``messages_in_order``, which every generated schedule satisfies (``labkit.parallel.pipeline.wire``).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.pipeline.schedules import Action, splits_backward
from labkit.parallel.pipeline.split import output_shapes, split_sequential
from labkit.parallel.pipeline.split_backward import PendingWeights, backward_input, backward_weight
from labkit.parallel.pipeline.wire import TAGGED_BACKENDS, Wire, message_tag, messages_in_order
from labkit.trace import span

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
            kept at once (forward done, backward — or, with ``W`` actions, W — not yet).
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


def run_schedule(
    schedule: Sequence[Sequence[Action | None]],
    stages: dict[int, nn.Module],
    inputs: Sequence[torch.Tensor],
    targets: Sequence[torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    shapes: Sequence[Sequence[int]],
    group: dist.ProcessGroup | None = None,
    compute_s: float | Mapping[str, float] = 0.0,
    timeout_s: float = 300.0,
    forward_context: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> PipelineResult:
    """Run this rank's row of ``schedule``: one training step's forwards and backwards.

    GPipe (Huang et al. 2019), 1F1B (Narayanan et al. 2021) and ZB-H1 (Qi et al. 2023) differ
    only in the schedule passed here. Gradients accumulate in the stages' parameters (zero them
    before a step); the result equals one backward of ``loss_fn`` over the whole batch on one
    process.

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
            is large next to communication: one number for every action (B = F, as in the
            schedules' time model), or seconds per op, e.g. ``{"F": c, "B": 2 * c}`` for a
            whole backward twice a forward, ``{"F": c, "B": c, "W": c}`` for a split one.
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
    backend = dist.get_backend(group)
    if backend not in TAGGED_BACKENDS and not messages_in_order(schedule, len(shapes)):
        raise ValueError(
            f"backend {backend!r} may match messages in order only (NCCL "
            "ignores tags), and this schedule receives some messages out of order; use gloo"
        )
    wire = Wire(group, n_ranks, timedelta(seconds=timeout_s))
    context = forward_context or contextlib.nullcontext
    seconds = compute_s if isinstance(compute_s, Mapping) else dict.fromkeys("FBW", compute_s)
    split = splits_backward(schedule)  # B = input gradient only; W = the weights' later
    n_stages, m = len(shapes), len(inputs)
    last = n_stages - 1
    saved: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    pending: dict[tuple[int, int], PendingWeights] = {}
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
                # split: B needs an input to differentiate, so the activations' gradients
                # run through every layer of the first stage too (its dx is dropped)
                x = inputs[i].detach().requires_grad_(True) if split else inputs[i]
            else:
                tag = message_tag(s - 1, i, m, False)
                x = wire.recv(inputs[i], shapes[s - 1], s - 1, tag, str(a))
                x.requires_grad_(True)
            with span(str(a), device=x.device, stage=s, op="F", microbatch=i), context():
                y = stages[s](x)
                if s == last:
                    y = loss_fn(y, targets[i]) / m  # mean over the whole batch
                _sleep(seconds.get("F", 0.0))
            saved[(s, i)] = (x, y)
            live[s] = live.get(s, 0) + 1
            result.peak_in_flight[s] = max(result.peak_in_flight.get(s, 0), live[s])
            if s < last:
                wire.send(y, s + 1, message_tag(s, i, m, False))
        elif a.op == "B":
            x, y = saved.pop((s, i))
            dy = None
            if s == last:
                wire.flush()
            else:
                dy = wire.recv(y, shapes[s], s + 1, message_tag(s, i, m, True), str(a))
            with span(str(a), device=y.device, stage=s, op="B", microbatch=i):
                if split:
                    dx, pending[(s, i)] = backward_input(y, dy, x, stages[s].parameters())
                else:
                    y.backward(dy)
                    dx = x.grad
                _sleep(seconds.get("B", 0.0))
            if not split:
                live[s] -= 1
            if s == last:
                result.loss = (result.loss or 0.0) + float(y.detach())
            if s > 0:
                wire.send(dx, s - 1, message_tag(s - 1, i, m, True))
        else:  # "W": nothing to receive or send
            wire.flush()
            with span(str(a), device=inputs[i].device, stage=s, op="W", microbatch=i):
                backward_weight(pending.pop((s, i)))
                _sleep(seconds.get("W", 0.0))
            live[s] -= 1
    wire.finish()
    result.n_sends = wire.n_sends
    return result


def _sleep(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)
