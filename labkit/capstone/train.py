"""Train a TinyGPT on the character corpus under a strategy, and the single-process reference.

Introduced in notebooks/17_capstone.ipynb.

Every rank draws the same global batch for step k (a generator seeded by the config's seed
and k) and keeps its data-parallel slice, so a run on any strategy and the reference on one
process see the same tokens and, with the gradients averaged, take the same Adam steps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from labkit.capstone.build import make_setup
from labkit.capstone.setups import lm_loss, make_groups
from labkit.capstone.strategy import Strategy
from labkit.data import CharCorpus, char_corpus
from labkit.models import TinyGPT
from labkit.trace import sync_device

__all__ = [
    "RunConfig",
    "build_model",
    "global_batch",
    "run",
    "run_many",
    "train_many",
    "train_rank",
    "train_reference",
]


@dataclass(frozen=True)
class RunConfig:
    """Sizes of the model and of the run.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        dim: model width h.
        n_layers: transformer blocks L.
        n_heads: attention heads.
        seq_len: characters per sequence T.
        batch: sequences per step, all ranks together.
        steps: optimizer steps.
        lr: Adam's learning rate.
        seed: model and batch seed.
        eval_every: a validation loss every this many steps (and after the last).
        val_batch: sequences in the (fixed) validation batch.
        timeout_s: timeout of the process groups the run creates.
    """

    dim: int = 64
    n_layers: int = 4
    n_heads: int = 4
    seq_len: int = 32
    batch: int = 16
    steps: int = 20
    lr: float = 3e-3
    seed: int = 0
    eval_every: int = 5
    val_batch: int = 16
    timeout_s: float = 60.0

    def check(self, strategy: Strategy) -> None:
        """Raise ``ValueError`` with the arithmetic when ``strategy`` cannot split this run."""
        s, problems = strategy, []
        if self.n_layers % s.pp:
            problems.append(f"pp({s.pp}) does not divide n_layers({self.n_layers})")
        if self.n_heads % s.tp or self.dim % s.tp:
            problems.append(f"tp({s.tp}) must divide n_heads({self.n_heads}) and dim({self.dim})")
        for name, b in (("batch", self.batch), ("val_batch", self.val_batch)):
            if b % (s.dp * s.microbatches):
                problems.append(f"dp({s.dp}) · microbatches({s.microbatches}) ∤ {name}({b})")
        if self.steps < 2 or self.eval_every < 1:
            problems.append(
                f"need steps >= 2 and eval_every >= 1, got {self.steps}, {self.eval_every}"
            )
        if problems:
            raise ValueError(f"{s.label} cannot train this model: " + "; ".join(problems))


def build_model(config: RunConfig, vocab_size: int) -> TinyGPT:
    """The TinyGPT of ``config`` (same weights for the same seed on every process).

    Introduced in notebooks/17_capstone.ipynb.
    """
    c = config
    return TinyGPT(vocab_size, c.dim, c.n_layers, c.n_heads, c.seq_len, seed=c.seed)


def global_batch(corpus: CharCorpus, config: RunConfig, step: int) -> tuple[torch.Tensor, ...]:
    """The whole batch of step ``step`` (the same on every rank); ``step = -1``: validation.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        corpus: the character corpus.
        config: the run (batch, val_batch, seq_len, seed).
        step: the optimizer step, or -1 for the fixed validation batch.

    Returns:
        ``(x, y)`` token ids, (batch, seq_len) each.
    """
    c = config
    g = torch.Generator().manual_seed(100_003 * c.seed + step + 1)
    if step < 0:
        return corpus.batch(c.val_batch, c.seq_len, "val", generator=g)
    return corpus.batch(c.batch, c.seq_len, "train", generator=g)


def _eval_steps(c: RunConfig) -> list[int]:
    return sorted({*range(c.eval_every, c.steps, c.eval_every), c.steps})


def train_rank(rank: int, world_size: int, strategy: Strategy, config: RunConfig) -> dict:
    """One rank of a run (``lk.launch`` calls it); returns what this rank measured.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        rank: global rank.
        world_size: must equal ``strategy.world_size``.
        strategy: how to split the model.
        config: the run.

    Returns:
        ``{"losses", "val_steps", "val_losses", "step_s", "bytes", "full_state"}``: the loss of
        the whole batch at each step and the validation losses (equal on every rank), the
        slowest rank's seconds per step, this rank's bytes of parameters, gradients and
        optimizer states after training, and (rank 0 only, else None) every parameter.

    Raises:
        ValueError: a world size other than the strategy's, or sizes it cannot split.
    """
    s, c = strategy, config
    if world_size != s.world_size:
        raise ValueError(f"{s.label} needs {s.world_size} ranks, launched on {world_size}")
    c.check(s)
    corpus = char_corpus()
    groups = make_groups(s, rank, c.timeout_s)
    setup = make_setup(s, groups, lambda: build_model(c, corpus.vocab_size), c.lr)

    def mine(t: torch.Tensor) -> torch.Tensor:  # this rank's data-parallel slice
        b = t.shape[0] // s.dp
        return t[groups.dp_rank * b : (groups.dp_rank + 1) * b]

    def agree(loss: float | None) -> float:  # mean over the ranks that computed a loss
        t = torch.tensor([loss or 0.0, float(loss is not None)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t[0] / t[1])

    xv, yv = (mine(t) for t in global_batch(corpus, c, -1))
    out: dict[str, Any] = {"losses": [], "val_steps": [0], "step_s": []}
    out["val_losses"] = [agree(setup.evaluate(xv, yv))]
    for k in range(c.steps):
        x, y = (mine(t) for t in global_batch(corpus, c, k))
        dist.barrier()
        sync_device(x.device)  # on a GPU, a step's time covers its kernels and transfers
        t0 = time.perf_counter()
        loss = setup.step(x, y)
        sync_device(x.device)
        elapsed = torch.tensor([time.perf_counter() - t0])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        out["step_s"].append(float(elapsed))
        out["losses"].append(agree(loss))
        if k + 1 in _eval_steps(c):
            out["val_steps"].append(k + 1)
            out["val_losses"].append(agree(setup.evaluate(xv, yv)))
    out["bytes"] = setup.state_bytes()
    full = setup.full_state()
    out["full_state"] = full if rank == 0 else None
    return out


def train_reference(config: RunConfig) -> dict:
    """The same run on one process: TinyGPT and ``torch.optim.Adam`` on the whole batch.

    Introduced in notebooks/17_capstone.ipynb.

    Returns:
        ``{"losses", "val_steps", "val_losses", "model"}`` (the trained model).
    """
    c = config
    corpus = char_corpus()
    model = build_model(c, corpus.vocab_size)
    opt = torch.optim.Adam(model.parameters(), lr=c.lr)
    xv, yv = global_batch(corpus, c, -1)

    def val() -> float:
        with torch.no_grad():
            return lm_loss(model(xv), yv).item()

    out: dict[str, Any] = {"losses": [], "val_steps": [0], "val_losses": [val()]}
    for k in range(c.steps):
        x, y = global_batch(corpus, c, k)
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        out["losses"].append(loss.item())
        if k + 1 in _eval_steps(c):
            out["val_steps"].append(k + 1)
            out["val_losses"].append(val())
    out["model"] = model
    return out


def run(
    strategy: Strategy, config: RunConfig, backend: str = "gloo", timeout: float = 120.0
) -> list[dict]:
    """Launch ``train_rank`` on ``strategy.world_size`` ranks; every rank's result, in order.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        strategy: how to split the model.
        config: the run.
        backend: process-group backend (CPU tensors: gloo or a labkit backend).
        timeout: seconds before the launch is stopped.

    Returns:
        ``train_rank``'s dicts, one per rank.

    Raises:
        ValueError: the config cannot be split by the strategy (checked before launching).
    """
    from labkit.launcher import launch

    config.check(strategy)
    return launch(
        train_rank,
        strategy.world_size,
        backend,
        args=(strategy, config),
        timeout=timeout,
        device="cpu",
    )


def train_many(rank: int, world_size: int, strategies: list[Strategy], config: RunConfig) -> dict:
    """``train_rank`` for each strategy in turn, in one launch (one process start-up for all).

    Introduced in notebooks/17_capstone.ipynb.

    Returns:
        ``{strategy.label: train_rank's dict}``.
    """
    return {s.label: train_rank(rank, world_size, s, config) for s in strategies}


def run_many(
    strategies: list[Strategy], config: RunConfig, backend: str = "gloo", timeout: float = 300.0
) -> dict[str, list[dict]]:
    """Train every strategy (all on the same world size) in one launch.

    Introduced in notebooks/17_capstone.ipynb.

    Args:
        strategies: strategies with one ``world_size``.
        config: the run.
        backend: process-group backend.
        timeout: seconds for all of them together.

    Returns:
        ``{label: [rank 0's dict, rank 1's, ...]}`` in the order given.

    Raises:
        ValueError: no strategies, different world sizes, or a config a strategy cannot split.
    """
    from labkit.launcher import launch

    sizes = {s.world_size for s in strategies}
    if len(sizes) != 1:
        raise ValueError(f"run_many needs strategies of one world size, got {sorted(sizes)}")
    for s in strategies:
        config.check(s)
    per_rank = launch(
        train_many, sizes.pop(), backend, args=(strategies, config), timeout=timeout, device="cpu"
    )
    return {s.label: [r[s.label] for r in per_rank] for s in strategies}
