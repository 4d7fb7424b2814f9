"""An asynchronous parameter server next to synchronous and local SGD; staleness and stragglers.

Introduced in notebooks/08_sync_vs_async.ipynb.

Rank 0 is the server, ranks 1..p−1 are workers (Li et al. 2014, "Scaling distributed machine
learning with the parameter server"; Dean et al. 2012, Downpour SGD). A worker pulls the
parameters and their version, computes a gradient on its next batch and pushes it with that
version; the server applies each gradient the moment it arrives, without waiting for the others,
and measures its **staleness** = server version − gradient version (the number of updates other
workers made while this gradient was being computed). One worker: staleness 0, exactly
sequential SGD. ``sync_sgd`` and ``local_sgd`` (in ``labkit.parallel.sync_sgd``, re-exported
here) use every rank as a worker and all-reduce.

Why point-to-point and not ``torch.distributed.rpc``: the protocol is one message each way with
a fixed shape, which isend/irecv carry on the same gloo group the rest of the course uses (CPU
tensors: NCCL has no any-source receive); RPC needs its own agent and init (TensorPipe) and
hides the message pattern the lesson is about. A push is one float32 message
``[gradient..., version, worker rank]``; a pull is ``[parameters..., kind (params or STOP),
version]``: every message carries the version (exact in float32 below 2^24 updates).
Per-worker irecvs polled with ``Work.is_completed()`` do not work on gloo (its p2p works
complete only inside ``wait()``), so the server posts one **any-source** irecv (``src=None``)
under the push tag and reads the sender from the message. Every wait has a timeout, and the
server ends the run by answering each worker's last push with STOP instead of parameters: no
message is left unmatched, nothing hangs.

The server hands out exactly ``updates`` gradient requests, so workers push, and the server
applies, exactly ``updates`` gradients.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from labkit.parallel.sgd_problem import (
    Problem,
    TrainLog,
    digits_problem,
    evaluate,
    gradient,
    initial_theta,
    pace,
    reference_sgd,
    regression_problem,
)
from labkit.parallel.sync_sgd import average_parameters, local_sgd, sync_sgd

__all__ = [
    "Problem",
    "TrainLog",
    "apply_gradient",
    "average_parameters",
    "digits_problem",
    "evaluate",
    "gradient",
    "initial_theta",
    "local_sgd",
    "pace",
    "parameter_server",
    "predicted_mean_staleness",
    "reference_sgd",
    "regression_problem",
    "sync_sgd",
]

SERVER = 0  # group rank of the parameter server
_TAG_PUSH, _TAG_PULL = 81, 82
_MAX_UPDATES = 2**24  # versions travel as float32 in the message: exact below 2^24
_PARAMS, _STOP = 0, 1  # kinds of pull header


def apply_gradient(
    theta: torch.Tensor, version: int, grad: torch.Tensor, grad_version: int, lr: float
) -> tuple[int, int]:
    """The server's step: SGD on ``theta`` in place; return the new version and the staleness.

    The reference solution of exercise ``08_apply_gradient``.
    Staleness as in Lian et al. 2015 ("Asynchronous parallel SGD for nonconvex optimization"):
    how many updates the server applied since the worker read version ``grad_version``.

    Args:
        theta: the server's flat parameters (updated in place: θ ← θ − lr·g).
        version: updates applied so far.
        grad: the pushed flat gradient.
        grad_version: the version the gradient was computed on.
        lr: learning rate.

    Returns:
        ``(version + 1, version − grad_version)``.
    """
    staleness = version - grad_version
    theta.add_(grad, alpha=-lr)
    return version + 1, staleness


def predicted_mean_staleness(updates: int, n_workers: int) -> float:
    """The mean staleness of a parameter-server run, exactly — whatever the workers' speeds.

    Each gradient's staleness counts the updates applied between its pull and its push, i.e. a
    gradient is counted once by every update made while it was in flight. When update u is
    applied, every other worker has exactly one gradient in flight (W − 1 of them) until the
    server runs out of gradients to hand out, after which N − u remain (Little's law, counted
    per update). Summing over u = 1..N: (N − W + 1)(W − 1) + (W − 1)(W − 2)/2. Speeds only
    change *which* gradients are stale (a straggler's are), not the mean.

    Args:
        updates: N, gradients applied (``parameter_server``'s ``updates``), N ≥ W.
        n_workers: W, workers (ranks − 1).

    Returns:
        The mean of ``TrainLog.staleness``.

    Raises:
        ValueError: ``updates < n_workers`` or ``n_workers < 1``.
    """
    n, w = updates, n_workers
    if w < 1 or n < w:
        raise ValueError(f"need updates ≥ n_workers ≥ 1, got {updates}, {n_workers}")
    return ((n - w + 1) * (w - 1) + (w - 1) * (w - 2) / 2) / n


def _wait(work: dist.Work, timeout_s: float, what: str) -> None:
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise RuntimeError(f"parameter server: {what} did not complete: {exc}") from exc


def _send(tensor: torch.Tensor, dst: int, tag: int, group, timeout_s: float) -> None:
    _wait(dist.isend(tensor, group=group, group_dst=dst, tag=tag), timeout_s, f"send to {dst}")


def _recv(tensor: torch.Tensor, src: int | None, tag: int, group, timeout_s: float) -> None:
    work = dist.irecv(tensor, group=group, group_src=src, tag=tag)
    _wait(work, timeout_s, f"receive from {'any worker' if src is None else src}")


def parameter_server(
    problem: Problem,
    updates: int,
    *,
    straggler: tuple[int, float] | None = None,
    step_time_s: float = 0.0,
    eval_every: int = 1,
    apply_fn: Callable[..., tuple[int, int]] = apply_gradient,
    timeout_s: float = 60.0,
    group: dist.ProcessGroup | None = None,
) -> TrainLog:
    """Asynchronous SGD: group rank 0 serves parameters, the other ranks push gradients.

    Call it on every rank of ``group``.

    Args:
        problem: what to train (same on every rank).
        updates: gradients the server hands out, pushes back and applies in total.
        straggler: ``(rank, k)``: that worker's every gradient takes k× longer (see ``pace``).
        step_time_s: floor of a worker's compute time per gradient (``pace``).
        eval_every: evaluate the loss every this many updates (and after the last one).
        apply_fn: the server's step, ``apply_gradient``'s signature.
        timeout_s: limit of every single send or receive.
        group: the process group (default: the default group).

    Returns:
        A ``TrainLog``: on the server one row per update; on a worker its gradient count.

    Raises:
        ValueError: fewer than 2 ranks, ``updates < 1``, or a straggler that is not a worker.
        RuntimeError: a send or receive exceeded ``timeout_s``.
    """
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if world_size < 2 or not 1 <= updates < _MAX_UPDATES:
        raise ValueError(f"need ≥ 2 ranks and 1 ≤ updates < 2^24, got {world_size}, {updates}")
    if straggler is not None and not 0 < straggler[0] < world_size:
        raise ValueError(f"straggler rank must be a worker 1..{world_size - 1}: {straggler}")
    log = TrainLog("async", rank, world_size, n_workers=world_size - 1)
    model = problem.model_fn()
    theta = initial_theta(model)
    _wait(dist.barrier(group=group, async_op=True), timeout_s, "start barrier")
    if rank == SERVER:
        _serve(log, model, theta, problem, updates, eval_every, apply_fn, timeout_s, group)
    else:
        slow = straggler[1] if straggler is not None and straggler[0] == rank else 1.0
        _work(log, model, theta, problem, step_time_s, slow, timeout_s, group)
    log.params = theta
    return log


def _serve(log, model, theta, problem, updates, eval_every, apply_fn, timeout_s, group) -> None:
    workers = range(1, log.world_size)
    log.per_worker = dict.fromkeys(workers, 0)
    log.initial_loss = evaluate(model, theta, problem)
    version, handed_out = 0, 0
    pull = torch.empty(theta.numel() + 2)  # [θ..., kind, version]
    start = time.perf_counter()

    def answer(worker: int) -> bool:  # hand out one more gradient, or tell the worker to stop
        nonlocal handed_out
        more = handed_out < updates
        handed_out += more
        pull[:-2], pull[-2], pull[-1] = theta, _PARAMS if more else _STOP, version
        _send(pull, worker, _TAG_PULL, group, timeout_s)
        return more

    busy = {w for w in workers if answer(w)}
    push = torch.empty(theta.numel() + 2)  # [g..., version the gradient was computed on, rank]
    while busy:
        _recv(push, None, _TAG_PUSH, group, timeout_s)  # any worker: whoever finished first
        grad_version, worker = int(push[-2]), int(push[-1])
        version, staleness = apply_fn(theta, version, push[:-2], grad_version, problem.lr)
        log.per_worker[worker] += 1
        log.gradients += 1
        last = log.gradients == updates
        evaluated = version % eval_every == 0 or last
        log.loss.append(evaluate(model, theta, problem) if evaluated else float("nan"))
        log.wall_s.append(time.perf_counter() - start)
        log.update.append(version)
        log.staleness.append(staleness)
        log.worker.append(worker)
        if not answer(worker):
            busy.discard(worker)


def _work(log, model, theta, problem, step_time_s, slow, timeout_s, group) -> None:
    pull, push = torch.empty(theta.numel() + 2), torch.empty(theta.numel() + 2)
    while True:
        _recv(pull, SERVER, _TAG_PULL, group, timeout_s)
        kind, version = int(pull[-2]), int(pull[-1])
        if kind == _STOP:
            return
        theta.copy_(pull[:-2])
        started = time.perf_counter()
        grad = gradient(model, theta, problem.batch(log.rank, log.gradients), problem.loss_fn)
        pace(started, step_time_s, slow)
        push[:-2], push[-2], push[-1] = grad, version, log.rank
        _send(push, SERVER, _TAG_PUSH, group, timeout_s)
        log.gradients += 1
