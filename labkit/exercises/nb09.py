"""Exercises of notebooks/09_accumulation_and_precision.ipynb.

Introduced in notebooks/09_accumulation_and_precision.ipynb.

``09_accumulation_step``: write ``step(model, optimizer, micro_batches, loss_fn)``, one optimizer
step over k micro-batches under DDP. The checker runs it on 2 ranks with PyTorch's
``DistributedDataParallel`` (buckets of 1 KB, so one round is 2 all-reduces) over the
recording backend, for 3 steps of k = 4 micro-batches of 8 samples, and checks that

- after every step the parameters equal one process stepping on the whole global batch of
  64 samples (``torch.testing.assert_close``, rtol 1e-5, atol 1e-6);
- every step after the first (DDP rebuilds its buckets after step 0) all-reduces exactly as
  often as one plain backward does — one round, not k.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner
from labkit.parallel.accumulate import accumulation_step, split_micro_batches

WORLD_SIZE = 2
K = 4  # micro-batches per rank and step
MICRO = 8  # samples per micro-batch
STEPS = 3
LR = 0.1
BUCKET_MB = 1024 / 2**20  # 1 KB buckets: the MLP below has 2
TOL = {"rtol": 1e-5, "atol": 1e-6}
TIMEOUT_S = 60.0

PROMPT = """Write `my_accumulation_step(model, optimizer, micro_batches, loss_fn)`: one optimizer
step over the k micro-batches `[(x, y), ...]` of this rank that equals one step on all of them
at once. Zero the gradients once; scale each micro-batch's loss by 1/k; run every backward but
the last inside `model.no_sync()` so DDP all-reduces once per step; then `optimizer.step()`."""


def reference_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    micro_batches: list[tuple[torch.Tensor, torch.Tensor]],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """Reference solution of ``09_accumulation_step``: ``lk.parallel.accumulate.accumulation_step``.

    Args:
        model: the DDP-wrapped model.
        optimizer: its optimizer.
        micro_batches: this rank's k micro-batches.
        loss_fn: mean loss of a micro-batch.

    Returns:
        None.
    """
    accumulation_step(model, optimizer, micro_batches, loss_fn)


def _model() -> nn.Module:
    from labkit.models import MLP

    return MLP(64, (32,), 10, seed=0)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(9)
    n = WORLD_SIZE * K * MICRO
    return torch.randn(STEPS, n, 64, generator=gen), torch.randint(0, 10, (STEPS, n), generator=gen)


def _flat(model: nn.Module) -> torch.Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _run(rank: int, world_size: int, fn: Callable) -> dict[str, Any]:
    from labkit.backends import recording

    x_all, y_all = _data()
    lo, hi = rank * K * MICRO, (rank + 1) * K * MICRO  # this rank's share of a global batch
    model = nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    params, reduces = [], []
    for s in range(STEPS):
        recording.clear()
        micro_batches = split_micro_batches(x_all[s, lo:hi], y_all[s, lo:hi], K)
        fn(model, opt, micro_batches, nn.CrossEntropyLoss())
        reduces.append(sum(r.op == "all_reduce" for r in recording.records()))
        params.append(_flat(model))
    recording.clear()  # one plain backward: the all-reduces of one round
    nn.functional.cross_entropy(model(x_all[0, lo:hi]), y_all[0, lo:hi]).backward()
    one_round = sum(r.op == "all_reduce" for r in recording.records())
    dist.barrier()
    return {"params": params, "reduces": reduces, "round": one_round}


def reference_params(variant: str = "large_batch") -> list[torch.Tensor]:
    """One process: parameters after each step on the global batch (or a known mistake).

    Args:
        variant: ``"large_batch"`` (the right answer); ``"last_micro_only"`` (zero_grad before
            each micro-batch: only the last one of every rank counts, its loss over k);
            ``"unscaled"`` (losses not divided by k: k times the gradient).

    Returns:
        list of flat parameter vectors, one per step.
    """
    x_all, y_all = _data()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = []
    for s in range(STEPS):
        x, y = x_all[s], y_all[s]
        scale = 1.0
        if variant == "last_micro_only":
            start = [r * K * MICRO + (K - 1) * MICRO for r in range(WORLD_SIZE)]
            keep = torch.cat([torch.arange(a, a + MICRO) for a in start])
            x, y, scale = x[keep], y[keep], 1.0 / K
        elif variant == "unscaled":
            scale = float(K)
        opt.zero_grad()
        (nn.functional.cross_entropy(model(x), y) * scale).backward()
        opt.step()
        out.append(_flat(model))
    return out


def _close(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return all(torch.allclose(g, w, **TOL) for g, w in zip(got, want, strict=True))


def _diagnose(got: list[torch.Tensor]) -> str:
    if _close(got, reference_params("last_micro_only")):
        return (
            "they equal a step on each rank's LAST micro-batch only: zeroing the gradients "
            "before every micro-batch throws the earlier ones away. Zero them once, before the "
            "loop."
        )
    if _close(got, reference_params("unscaled")):
        return (
            f"they equal a step with {K}× the gradient: divide each micro-batch's loss by k = {K} "
            "(the large batch's loss is the mean over all samples)."
        )
    return "check that you zero the gradients once, scale each loss by 1/k and step once."


def _compare(results: list[dict[str, Any]]) -> dict[str, Any]:
    want = reference_params()
    for rank, res in enumerate(results):
        for s, (g, w) in enumerate(zip(res["params"], want, strict=True)):
            if not torch.allclose(g, w, **TOL):
                diff = (g - w).abs().max().item()
                raise ExerciseFailed(
                    f"rank {rank}: after step {s + 1} the parameters differ from one process "
                    f"stepping on the whole global batch ({WORLD_SIZE} ranks × {K} × {MICRO} "
                    f"samples) by up to {diff:.2e}; " + _diagnose(res["params"])
                )
    for rank, res in enumerate(results):
        one_round, per_step = res["round"], res["reduces"][1:]  # step 0 builds the buckets
        if any(n != one_round for n in per_step):
            raise ExerciseFailed(
                f"rank {rank}: the parameters are right, but DDP all-reduced {per_step} times in "
                f"steps 2..{STEPS} where one round is {one_round} (one per bucket): run every "
                "backward except the last inside `with model.no_sync():`."
            )
    return {
        "world_size": WORLD_SIZE,
        "k": K,
        "steps": STEPS,
        "all_reduces_per_step": results[0]["reduces"][-1],
    }


@exercise("09_accumulation_step", reference=reference_step, prompt=PROMPT)
def check_accumulation_step(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a gradient-accumulation step under DDP: large-batch parameters, one round a step.

    Args:
        fn: the learner's ``fn(model, optimizer, micro_batches, loss_fn)``.

    Returns:
        ``{"world_size", "k", "steps", "all_reduces_per_step"}``: what was checked.

    Raises:
        ExerciseFailed: parameters that differ from the large batch (with the likely mistake),
            k all-reduce rounds per step, or an error in a rank.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    results = launch_learner(
        _run,
        WORLD_SIZE,
        backend="labkit_record",
        args=(fn,),
        timeout_s=TIMEOUT_S,
        device="auto",
        did_not_finish="nothing finished within {timeout_s:g} s:",
        hang="do all ranks run the same number of backward passes?",
        stacks=True,
        failed="{cause}",
    )
    return _compare(results)
