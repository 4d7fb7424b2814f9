"""Exercises of notebooks/12_tensor_parallel.ipynb.

Introduced in notebooks/12_tensor_parallel.ipynb.

``12_f_operator``: write Megatron's ``f`` (Shoeybi et al. 2019, §3, Figure 3): identity in
forward, all-reduce of the gradient in backward. Every rank feeds the same input ``X`` to its
column-parallel shard, so ``∂L/∂X`` is the sum of the ranks' contributions. The checker runs a
tensor-parallel MLP on 2 and 4 ranks whose ``f`` is the learner's function (``g`` is labkit's)
and compares the output, the input's gradient and every weight shard's gradient with the
unsplit MLP in one process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner
from labkit.parallel.tensor.comm import copy_to_parallel, reduce_from_parallel

WORLD_SIZES = (2, 4)
TIMEOUT_S = 60.0
B, T, H, HIDDEN = 2, 3, 8, 16  # batch, sequence, width, MLP hidden width
RTOL, ATOL = 1e-5, 1e-6

PROMPT = """Write `my_f(x, group=None)`, Megatron's f operator: it returns x unchanged in
forward, and in backward all-reduces (sums) the incoming gradient over the ranks of `group`.
Write a `torch.autograd.Function` with static `forward(ctx, x)` and `backward(ctx, grad)`."""


def reference_f(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Megatron's ``f``: identity forward, all-reduce backward (reference of ``12_f_operator``).

    Args:
        x: the replicated input of a column-parallel layer.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: ``x``, whose gradient is summed over the group in backward.
    """
    return copy_to_parallel(x, group)


def _mlp():
    from labkit.models import FeedForward

    return FeedForward(H, HIDDEN, seed=12)


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(12)
    return torch.randn(B, T, H, generator=g), torch.randn(B, T, H, generator=g)


def _run(rank: int, world_size: int, fn: Callable[..., torch.Tensor]) -> dict[str, Any]:
    mlp = _mlp()
    rows = slice(rank * HIDDEN // world_size, (rank + 1) * HIDDEN // world_size)
    w1 = mlp.fc1.weight.detach()[rows].clone().requires_grad_(True)
    b1 = mlp.fc1.bias.detach()[rows].clone().requires_grad_(True)
    w2 = mlp.fc2.weight.detach()[:, rows].clone().requires_grad_(True)
    x, w = _data()
    x.requires_grad_(True)
    x_in = fn(x)
    h = F.gelu(F.linear(x_in, w1, b1))  # (B, T, HIDDEN/p): this rank's columns
    y = reduce_from_parallel(F.linear(h, w2)) + mlp.fc2.bias.detach()
    (y * w).sum().backward()
    same = isinstance(x_in, torch.Tensor) and torch.equal(x_in.detach(), x.detach())
    return {"same": same, "y": y.detach(), "x_grad": x.grad, "w1": w1.grad, "w2": w2.grad}


def _reference() -> dict[str, torch.Tensor]:
    mlp = _mlp()
    x, w = _data()
    x.requires_grad_(True)
    (mlp(x) * w).sum().backward()
    return {"x_grad": x.grad, "w1": mlp.fc1.weight.grad, "w2": mlp.fc2.weight.grad}


def _compare(p: int, results: list[dict[str, Any]]) -> None:
    ref = _reference()
    for rank, res in enumerate(results):
        if not res["same"]:
            raise ExerciseFailed(
                f"on {p} ranks, rank {rank}: my_f(x) must return x unchanged in forward (f is "
                "the identity forward; g does the all-reduce)"
            )
        got, want = res["x_grad"], ref["x_grad"]
        if got is None or not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
            hint = "x got no gradient: return the result of your Function's apply."
            if got is not None and torch.allclose(got * p, want, rtol=1e-4, atol=1e-5):
                hint = "it is 1/p of the unsplit gradient: use a SUM all-reduce, not an average."
            elif got is not None:
                hint = (
                    "it is only this rank's part of the gradient: all-reduce the gradient in "
                    "backward (each rank's shard contributes to ∂L/∂x)."
                )
            raise ExerciseFailed(
                f"on {p} ranks, rank {rank}: the input's gradient differs from the unsplit "
                f"MLP's; {hint}"
            )
        cols = slice(rank * HIDDEN // p, (rank + 1) * HIDDEN // p)
        for name, layer, full in (
            ("w1", "fc1", ref["w1"][cols]),
            ("w2", "fc2", ref["w2"][:, cols]),
        ):
            if not torch.allclose(res[name], full, rtol=RTOL, atol=ATOL):
                raise ExerciseFailed(
                    f"on {p} ranks, rank {rank}: {layer}'s weight gradient differs"
                )


@exercise("12_f_operator", reference=reference_f, prompt=PROMPT)
def check_f_operator(fn: Callable[..., torch.Tensor]) -> dict[str, Any]:
    """Check the learner's ``f`` inside a tensor-parallel MLP against the unsplit MLP.

    Args:
        fn: the learner's ``my_f(x, group=None)``.

    Returns:
        ``{"world_sizes": [...]}``: the worlds checked.

    Raises:
        ExerciseFailed: the forward changed ``x``, or the input's or a weight shard's gradient
            differs from the unsplit model's; the function raised or hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    for p in WORLD_SIZES:
        results = launch_learner(
            _run,
            p,
            backend="gloo",
            args=(fn,),
            timeout_s=TIMEOUT_S,
            did_not_finish="on {world_size} {ranks} my_f did not finish within {timeout_s:g} s:",
            hang="every rank must all-reduce the gradient once.",
        )
        _compare(p, results)
    return {"world_sizes": list(WORLD_SIZES)}
