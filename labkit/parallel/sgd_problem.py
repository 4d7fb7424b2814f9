"""What the SGD variants of notebook 08 train, what they report, and the single-process reference.

Introduced in notebooks/08_sync_vs_async.ipynb.

A ``Problem`` bundles a model factory, training data, a fixed evaluation set, the loss, the
batch size and the learning rate. Batches are a pure function of ``(worker, step)``, so a
distributed run and ``reference_sgd`` in one process see exactly the same samples. Parameters
travel and are updated as one flat float32 vector ``theta`` (``torch.nn.utils``'s
``parameters_to_vector`` layout), which is what the parameter server stores and sends.

``TrainLog`` is the plain-data result every rank returns: one row per update (wall time, update
number, loss on the evaluation set, staleness, which worker's gradient made it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from labkit.data import digits, synthetic_regression
from labkit.models import MLP

__all__ = [
    "Problem",
    "TrainLog",
    "digits_problem",
    "evaluate",
    "gradient",
    "initial_theta",
    "pace",
    "reference_sgd",
    "regression_problem",
]


@dataclass(frozen=True)
class Problem:
    """A training problem: model factory, data, evaluation set, loss, batch size, step size.

    Args:
        model_fn: builds the model; must give identical weights on every call (a seed).
        x, y: the training inputs and targets.
        eval_x, eval_y: the fixed evaluation set every logged loss is measured on.
        loss_fn: ``loss_fn(output, target)``, a mean over the batch.
        batch_size: samples per gradient.
        lr: SGD learning rate.
        seed: seeds the batch sampler (see ``batch``).
    """

    model_fn: Callable[[], nn.Module]
    x: torch.Tensor
    y: torch.Tensor
    eval_x: torch.Tensor
    eval_y: torch.Tensor
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    batch_size: int = 32
    lr: float = 0.1
    seed: int = 0

    def batch(self, worker: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``step``-th batch of worker ``worker``: indices drawn from a seed of both.

        Args:
            worker: the rank computing the gradient.
            step: how many gradients that worker computed before this one.

        Returns:
            ``(x, y)`` with ``batch_size`` rows, sampled with replacement.
        """
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + worker) * 1_000_003 + step)
        idx = torch.randint(len(self.x), (self.batch_size,), generator=g)
        return self.x[idx], self.y[idx]


def digits_problem(
    batch_size: int = 32, lr: float = 0.1, hidden: tuple[int, ...] = (64,), seed: int = 0
) -> Problem:
    """Classify scikit-learn's 8×8 digits with an MLP; evaluate on the held-out split.

    Args:
        batch_size: samples per gradient.
        lr: SGD learning rate.
        hidden: the MLP's hidden widths.
        seed: model initialisation, train/test split and batch seed.

    Returns:
        The ``Problem`` (cross-entropy loss).
    """
    train, test = digits("train", seed=seed), digits("test", seed=seed)
    return Problem(
        model_fn=partial(MLP, 64, tuple(hidden), 10, seed=seed),
        x=train.tensors[0],
        y=train.tensors[1],
        eval_x=test.tensors[0],
        eval_y=test.tensors[1],
        loss_fn=F.cross_entropy,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
    )


def regression_problem(
    n_samples: int = 512,
    in_features: int = 16,
    batch_size: int = 16,
    lr: float = 0.05,
    seed: int = 0,
) -> Problem:
    """Linear regression on ``lk.data.synthetic_regression`` with a single linear layer.

    Args:
        n_samples: training rows (256 more rows of the same draw are the evaluation set).
        in_features: width of x.
        batch_size: samples per gradient.
        lr: SGD learning rate.
        seed: data, model and batch seed.

    Returns:
        The ``Problem`` (mean squared error).
    """
    train, _, _ = synthetic_regression(n_samples + 256, in_features, 1, 0.01, seed=seed)
    x, y = train.tensors
    return Problem(
        model_fn=partial(MLP, in_features, (), 1, seed=seed),
        x=x[:n_samples],
        y=y[:n_samples],
        eval_x=x[n_samples:],
        eval_y=y[n_samples:],
        loss_fn=F.mse_loss,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
    )


@dataclass
class TrainLog:
    """What one rank reports after training: plain lists, one entry per update, and totals.

    Rows are filled on rank 0 (the parameter server, or the rank that evaluates in sync and
    local SGD); other ranks return empty rows and their own ``gradients`` count.
    ``loss`` is NaN for updates that were not evaluated (``eval_every``).
    """

    method: str  # "async", "sync" or "local"
    rank: int
    world_size: int
    n_workers: int  # ranks that compute gradients
    initial_loss: float = math.nan
    wall_s: list[float] = field(default_factory=list)  # since training started
    update: list[int] = field(default_factory=list)  # optimizer steps applied so far
    loss: list[float] = field(default_factory=list)  # on the evaluation set, after the update
    staleness: list[int] = field(default_factory=list)  # server version − gradient version
    worker: list[int] = field(default_factory=list)  # whose gradient; -1 = every rank's
    gradients: int = 0  # gradients this rank computed (server: gradients it applied)
    per_worker: dict[int, int] = field(default_factory=dict)  # server: applied per worker
    params: torch.Tensor | None = None  # final flat parameters on this rank
    averaged: list[torch.Tensor] = field(default_factory=list)  # local SGD: after each average

    @property
    def updates_per_s(self) -> float:
        """Updates applied per second of wall time."""
        return self.update[-1] / self.wall_s[-1] if self.wall_s and self.wall_s[-1] > 0 else 0.0

    @property
    def final_loss(self) -> float:
        """The last evaluated loss."""
        done = [v for v in self.loss if not math.isnan(v)]
        return done[-1] if done else self.initial_loss


def initial_theta(model: nn.Module) -> torch.Tensor:
    """The model's parameters as one flat float32 vector (a copy)."""
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _load(model: nn.Module, theta: torch.Tensor) -> None:
    # Copy (not alias, unlike vector_to_parameters) so later in-place updates of theta
    # cannot change the model behind autograd's back.
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.copy_(theta[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def gradient(
    model: nn.Module, theta: torch.Tensor, batch: tuple[torch.Tensor, torch.Tensor], loss_fn
) -> torch.Tensor:
    """The flat gradient of ``loss_fn`` on ``batch`` at parameters ``theta``.

    Args:
        model: the module whose parameters are set to ``theta`` first.
        theta: flat parameters (``parameters_to_vector`` layout).
        batch: ``(x, y)``.
        loss_fn: ``loss_fn(model(x), y)`` → scalar.

    Returns:
        The gradient as one flat vector, same layout as ``theta``.
    """
    _load(model, theta)
    model.zero_grad(set_to_none=True)
    x, y = batch
    loss_fn(model(x), y).backward()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def evaluate(model: nn.Module, theta: torch.Tensor, problem: Problem) -> float:
    """Loss of parameters ``theta`` on the problem's fixed evaluation set."""
    _load(model, theta)
    with torch.no_grad():
        return float(problem.loss_fn(model(problem.eval_x), problem.eval_y))


def pace(started: float, step_time_s: float, slowdown: float) -> None:
    """Make a gradient take ``slowdown × max(its compute time, step_time_s)`` by sleeping.

    ``step_time_s`` pads every worker's compute to a floor, as if the model were larger
    (sleeping, so a shared CPU is not burnt); a straggler (``slowdown = k``) then sleeps
    (k − 1) times that padded time. With a floor above the real compute time, every step's
    duration is fixed by these two numbers alone: deterministic, whatever else the machine runs.

    Args:
        started: ``time.perf_counter()`` when the gradient computation began.
        step_time_s: the floor of a step's compute time (0: none).
        slowdown: 1 for a normal worker, k for a straggler k× slower.
    """
    elapsed = time.perf_counter() - started
    target = max(elapsed, step_time_s) * slowdown
    if target > elapsed:
        time.sleep(target - elapsed)


def reference_sgd(
    problem: Problem, schedule: Sequence[Sequence[tuple[int, int]]]
) -> tuple[torch.Tensor, list[float]]:
    """Single-process SGD: update k uses the concatenation of the batches in ``schedule[k]``.

    With one ``(worker, step)`` pair per update this is sequential SGD (what a one-worker parameter
    server must reproduce); with ``[(r, k) for r in range(p)]`` it is large-batch SGD (what
    synchronous SGD must reproduce).

    Args:
        problem: what to train.
        schedule: per update, the ``(worker, step)`` batches whose union forms its batch.

    Returns:
        ``(theta, losses)``: final flat parameters and the evaluation loss after each update.
    """
    # One thread, like every rank lk.launch starts: a matrix product split over threads adds
    # its partial sums in another order, and the bit-for-bit comparisons would fail.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = problem.model_fn()
        theta = initial_theta(model)
        losses = []
        for pairs in schedule:
            xs, ys = zip(*(problem.batch(w, s) for w, s in pairs), strict=True)
            batch = (torch.cat(xs), torch.cat(ys)) if len(xs) > 1 else (xs[0], ys[0])
            theta.add_(gradient(model, theta, batch, problem.loss_fn), alpha=-problem.lr)
            losses.append(evaluate(model, theta, problem))
    finally:
        torch.set_num_threads(threads)
    return theta, losses
