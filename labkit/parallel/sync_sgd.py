"""Synchronous SGD (average gradients every step) and local SGD (average parameters every H steps).

Introduced in notebooks/08_sync_vs_async.ipynb, next to the asynchronous parameter server of
``labkit.parallel.async_sgd`` (which re-exports these functions).

Every rank is a worker. **Sync SGD**: each step every rank computes a gradient on its own batch,
an all-reduce averages them and every rank applies the same update — the same as one process
taking a step on the union of the batches (Goyal et al. 2017, "Accurate, large minibatch SGD").
The slowest rank sets the pace. **Local SGD**: every rank takes H steps on its own, then the
ranks average their parameters (Stich 2019, "Local SGD converges fast and communicates little";
Lin et al. 2020, "Don't use large mini-batches, use local SGD"): H times fewer all-reduces, at
the price of replicas drifting apart between averages. H = 1 is sync SGD.
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
    evaluate,
    gradient,
    initial_theta,
    pace,
)

__all__ = ["average_parameters", "local_sgd", "sync_sgd"]


def _all_reduce(tensor: torch.Tensor, group, timeout_s: float) -> None:
    work = dist.all_reduce(tensor, group=group, async_op=True)
    try:
        work.wait(timedelta(seconds=timeout_s))
    except RuntimeError as exc:
        raise RuntimeError(f"all_reduce did not complete within {timeout_s} s: {exc}") from exc


def average_parameters(theta: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
    """Replace every rank's flat parameters by their mean over the group, in place.

    The reference solution of exercise ``08_average_parameters``.
    Local SGD's averaging step (Stich 2019, Algorithm 1): one all-reduce (sum), then ÷ p.

    Args:
        theta: this rank's flat parameters.
        group: the process group (default: the default group).

    Returns:
        None; ``theta`` holds the mean on every rank.
    """
    dist.all_reduce(theta, group=group)
    theta.div_(dist.get_world_size(group))


def _slowdown(straggler: tuple[int, float] | None, rank: int, world_size: int) -> float:
    if straggler is None:
        return 1.0
    if not 0 <= straggler[0] < world_size:
        raise ValueError(f"straggler rank must be in 0..{world_size - 1}: {straggler}")
    return straggler[1] if straggler[0] == rank else 1.0


def _record(log: TrainLog, model, theta, problem, step, evaluated, start) -> None:
    log.loss.append(evaluate(model, theta, problem) if evaluated else float("nan"))
    log.wall_s.append(time.perf_counter() - start)
    log.update.append(step)
    log.staleness.append(0)
    log.worker.append(-1)


def sync_sgd(
    problem: Problem,
    steps: int,
    *,
    straggler: tuple[int, float] | None = None,
    step_time_s: float = 0.0,
    eval_every: int = 1,
    timeout_s: float = 60.0,
    group: dist.ProcessGroup | None = None,
) -> TrainLog:
    """Synchronous data-parallel SGD: all-reduce the gradients every step.

    Call it on every rank of ``group``; rank r uses ``problem.batch(r, step)``.

    Args:
        problem: what to train (same on every rank).
        steps: optimizer steps (each uses p gradients).
        straggler: ``(rank, k)``: that rank's every gradient takes k× longer (``pace``).
        step_time_s: floor of each rank's compute time per gradient (``pace``).
        eval_every: rank 0 evaluates the loss every this many steps (and after the last).
        timeout_s: limit of every all-reduce.
        group: the process group (default: the default group).

    Returns:
        A ``TrainLog`` (rows on rank 0; ``params`` on every rank).

    Raises:
        ValueError: ``steps < 1`` or a straggler rank outside the group.
        RuntimeError: an all-reduce exceeded ``timeout_s``.
    """
    return _train("sync", problem, steps, 1, straggler, step_time_s, eval_every, timeout_s, group)


def local_sgd(
    problem: Problem,
    steps: int,
    period: int,
    *,
    straggler: tuple[int, float] | None = None,
    step_time_s: float = 0.0,
    average_fn: Callable[..., None] = average_parameters,
    timeout_s: float = 60.0,
    group: dist.ProcessGroup | None = None,
) -> TrainLog:
    """Local SGD: every rank steps on its own batches; average parameters every ``period`` steps.

    Rank 0 logs (and evaluates) one row per averaging round; ``averaged`` keeps each rank's
    parameters right after every round.

    Args:
        problem: what to train (same on every rank).
        steps: local optimizer steps per rank (a final average follows the last one).
        period: H, local steps between averages (1: the same updates as ``sync_sgd``).
        straggler: ``(rank, k)``: that rank's every gradient takes k× longer (``pace``).
        step_time_s: floor of each rank's compute time per gradient (``pace``).
        average_fn: ``average_fn(theta, group)``, ``average_parameters``'s signature.
        timeout_s: limit of every all-reduce made here.
        group: the process group (default: the default group).

    Returns:
        A ``TrainLog``.

    Raises:
        ValueError: ``steps < 1``, ``period < 1`` or a straggler rank outside the group.
    """
    if period < 1:
        raise ValueError(f"period must be ≥ 1, got {period}")
    return _train(
        "local", problem, steps, period, straggler, step_time_s, 1, timeout_s, group, average_fn
    )


def _train(
    method, problem, steps, period, straggler, step_time_s, eval_every, timeout_s, group,
    average_fn=average_parameters,
) -> TrainLog:  # fmt: skip
    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    if steps < 1:
        raise ValueError(f"steps must be ≥ 1, got {steps}")
    slow = _slowdown(straggler, rank, world_size)
    log = TrainLog(method, rank, world_size, n_workers=world_size)
    model = problem.model_fn()
    theta = initial_theta(model)
    if rank == 0:
        log.initial_loss = evaluate(model, theta, problem)
    _all_reduce(torch.zeros(1), group, timeout_s)  # start together
    start = time.perf_counter()
    for step in range(1, steps + 1):
        started = time.perf_counter()
        grad = gradient(model, theta, problem.batch(rank, step - 1), problem.loss_fn)
        pace(started, step_time_s, slow)
        log.gradients += 1
        if method == "sync":
            _all_reduce(grad, group, timeout_s)
            grad.div_(world_size)
        theta.add_(grad, alpha=-problem.lr)
        if method == "local" and (step % period == 0 or step == steps):
            average_fn(theta, group)
            log.averaged.append(theta.clone())
        elif method == "local":
            continue
        if rank == 0:
            evaluated = method == "local" or step % eval_every == 0 or step == steps
            _record(log, model, theta, problem, step, evaluated, start)
    log.params = theta
    return log
