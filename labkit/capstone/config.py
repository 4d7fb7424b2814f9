"""A capstone run's sizes and training recipe, its model, its batches and its learning rates.

Introduced in notebooks/21_capstone.ipynb.

The recipe is the course's (notebook 09): micro-batches with one reduction per step (the
strategy's ``microbatches``), bf16 autocast, clipping of the global gradient norm after the
reduction, a warmup to the square-root-scaled rate of Adam (Malladi et al. 2022) and a cosine
decay (``lk.optim.linear_scaling_warmup``); and notebook 19's DCP checkpoint mid-run.
Every rank draws the same global batch for step k (a generator seeded by the seed and k), so
a run on any strategy and the one-process reference see the same tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from labkit.capstone.strategy import Strategy
from labkit.data import CharCorpus
from labkit.models import TinyGPT
from labkit.optim import linear_scaling_warmup
from labkit.precision import autocast

__all__ = [
    "DECAYS",
    "RunConfig",
    "autocast_context",
    "build_model",
    "global_batch",
    "make_schedule",
]

DECAYS = ("constant", "cosine")


@dataclass(frozen=True)
class RunConfig:
    """Sizes of the model and of the run, and the training recipe.

    Args:
        dim: model width h.
        n_layers: transformer blocks L.
        n_heads: attention heads.
        seq_len: characters per sequence T.
        batch: sequences per step, all ranks together.
        steps: optimizer steps.
        lr: Adam's base learning rate (tuned for ``base_batch``).
        seed: model and batch seed.
        eval_every: a validation loss every this many steps (and after the last).
        val_batch: sequences in the (fixed) validation batch.
        timeout_s: timeout of a pipeline's receives.
        precision: ``"fp32"`` or ``"bf16"`` (autocast around each forward and its loss).
        max_norm: clip the global gradient norm to this after the reduction (None: no clip).
        warmup_steps: steps of linear warmup from ``lr`` to the scaled rate.
        decay: ``"constant"`` or ``"cosine"`` (to ``final_fraction`` of the peak at ``steps``).
        base_batch: the batch ``lr`` was tuned for; the peak rate is lr · √(batch/base_batch)
            (None: ``batch``, no scaling).
        final_fraction: the cosine's end as a fraction of the peak.
        ckpt_dir: where DCP checkpoints go, a folder per strategy (``checkpoint_dir``).
        ckpt_at: save one after this many steps (needs ``ckpt_dir``).
        resume: start from the newest complete checkpoint in ``ckpt_dir``.
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
    precision: str = "fp32"
    max_norm: float | None = None
    warmup_steps: int = 0
    decay: str = "constant"
    base_batch: int | None = None
    final_fraction: float = 0.1
    ckpt_dir: str | None = None
    ckpt_at: int | None = None
    resume: bool = False

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
        problems += self._recipe_problems()
        if problems:
            raise ValueError(f"{s.label} cannot train this model: " + "; ".join(problems))

    def _recipe_problems(self) -> list[str]:
        problems = []
        if self.precision not in ("fp32", "bf16"):
            problems.append(f"precision must be fp32 or bf16, got {self.precision!r}")
        if self.decay not in DECAYS:
            problems.append(f"decay must be one of {DECAYS}, got {self.decay!r}")
        if self.decay == "cosine" and not 0 <= self.warmup_steps < self.steps:
            problems.append(f"cosine needs 0 <= warmup_steps({self.warmup_steps}) < steps")
        if self.max_norm is not None and not self.max_norm > 0:
            problems.append(f"max_norm must be > 0, got {self.max_norm}")
        if self.ckpt_at is not None and not (self.ckpt_dir and 0 < self.ckpt_at < self.steps):
            problems.append(f"ckpt_at({self.ckpt_at}) needs a ckpt_dir and 0 < ckpt_at < steps")
        if self.resume and not self.ckpt_dir:
            problems.append("resume needs a ckpt_dir")
        return problems


def build_model(config: RunConfig, vocab_size: int) -> TinyGPT:
    """The TinyGPT of ``config`` (same weights for the same seed on every process)."""
    c = config
    return TinyGPT(vocab_size, c.dim, c.n_layers, c.n_heads, c.seq_len, seed=c.seed)


def global_batch(corpus: CharCorpus, config: RunConfig, step: int) -> tuple[torch.Tensor, ...]:
    """The whole batch of step ``step`` (the same on every rank); ``step = -1``: validation.

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


def make_schedule(
    optimizer: torch.optim.Optimizer, config: RunConfig
) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup to lr · √(batch/base_batch), then constant or cosine (notebook 09's schedule).

    Args:
        optimizer: built with the base rate ``config.lr``.
        config: the run.

    Returns:
        A ``LambdaLR``; call its ``step()`` once per optimizer step.
    """
    c = config
    return linear_scaling_warmup(
        optimizer,
        c.batch,
        c.base_batch or c.batch,
        c.warmup_steps,
        rule="sqrt",
        decay="cosine" if c.decay == "cosine" else "step",
        total_steps=c.steps,
        final_fraction=c.final_fraction,
    )


def autocast_context(config: RunConfig, device: torch.device) -> Callable[[], Any]:
    """A factory of ``config.precision``'s autocast context on ``device`` (fp32: disabled)."""
    return lambda: autocast(config.precision, device)
