"""Exercises of notebooks/10_model_parallel.ipynb.

Introduced in notebooks/10_model_parallel.ipynb.

``10_stage_backward``: write the backward step of a middle stage of a model split across
ranks: receive the gradient of the stage's output from rank ``r + 1``, run
``torch.autograd.backward(output, grad)`` and send the gradient of the stage's input to rank
``r − 1``. The checker splits an MLP over 3 and 4 ranks, lets ``labkit.parallel.model_split``
run every forward and the first and last stages' backwards, calls the learner's function on
the middle stages, and compares every parameter's gradient with one process's backward.
Its own receives give up after a few seconds, so a missing send fails instead of hanging.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner

WORLD_SIZES = (3, 4)
TIMEOUT_S = 60.0  # the whole launch
RECV_TIMEOUT_S = 5.0  # labkit's stages' receives (a missing message fails in 5 s)
BATCH, IN, HIDDEN, OUT = 6, 10, 12, 4
RTOL, ATOL = 1e-5, 1e-6

PROMPT = """Write `my_stage_backward(inp, out, group=None)` for a middle stage r of a model
split over the ranks of `group`: `inp` is the stage's input (received from rank r − 1, with
requires_grad), `out` its output (sent to rank r + 1). Receive the gradient of `out` from rank
r + 1, call `torch.autograd.backward(out, grad)`, and send `inp.grad` to rank r − 1. Use
`dist.irecv(...).wait(timeout)` / `dist.isend(...).wait(timeout)` with `group_src` /
`group_dst` ranks of `group`."""


def reference_stage_backward(
    inp: torch.Tensor, out: torch.Tensor, group: dist.ProcessGroup | None = None
) -> None:
    """A middle stage's backward over send/recv (reference of ``10_stage_backward``).

    Args:
        inp: the stage's input (a leaf with ``requires_grad``), received from rank r − 1.
        out: the stage's output, sent to rank r + 1 in forward.
        group: the group the stages live in (None: the default group).

    Returns:
        None; the stage's parameters hold their gradients and rank r − 1 has ``inp.grad``.
    """
    r, wait = dist.get_rank(group), timedelta(seconds=TIMEOUT_S)
    grad = torch.empty_like(out)  # the shape was agreed in forward: out's own
    dist.irecv(grad, group=group, group_src=r + 1).wait(wait)
    torch.autograd.backward(out, grad)
    dist.isend(inp.grad.contiguous(), group=group, group_dst=r - 1).wait(wait)


def _model():
    from labkit.models import MLP

    return MLP(in_features=IN, hidden=(HIDDEN,) * 5, out_features=OUT, seed=10).net


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10)
    return torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> dict[str, Any]:
    from labkit.parallel.model_split import ModelSplit, output_shapes, split_model

    model = _model()
    stages = split_model(model, world_size)
    x, y = _batch()
    split = ModelSplit(
        stages[rank], output_shapes(stages, x), F.cross_entropy, timeout_s=RECV_TIMEOUT_S
    )
    split.forward(x if split.is_first else None, y if split.is_last else None)
    if split.is_first or split.is_last:
        split.backward()
    else:
        fn(split.input, split.output, None)
    mine = {id(q) for q in stages[rank].parameters()}
    return {n: q.grad for n, q in model.named_parameters() if id(q) in mine}


def _reference() -> dict[str, torch.Tensor]:
    model = _model()
    x, y = _batch()
    F.cross_entropy(model(x), y).backward()
    return {n: q.grad for n, q in model.named_parameters()}


def _compare(p: int, results: list[dict[str, Any]]) -> None:
    ref = _reference()
    for rank, grads in reversed(list(enumerate(results))):  # backward order: culprit first
        middle = 0 < rank < p - 1
        for name, g in grads.items():
            if g is None:
                raise ExerciseFailed(
                    f"on {p} ranks, stage {rank}'s {name} got no gradient: call "
                    "torch.autograd.backward(out, grad) with the received gradient"
                )
            if torch.allclose(g, ref[name], rtol=RTOL, atol=ATOL):
                continue
            if middle:
                hint = "backward must start from the gradient received from rank r + 1"
            else:
                hint = (
                    f"stage {rank} received a wrong gradient from stage {rank + 1}: send "
                    "inp.grad (the gradient of the stage's input), after the backward"
                )
            raise ExerciseFailed(f"on {p} ranks, stage {rank}'s {name} gradient differs: {hint}")


def _never_came_hint(cause: str) -> str:
    if "Timed out" not in cause:
        return ""
    return (
        " — a stage waited for a message that never came: send inp.grad to rank r − 1 "
        "(not r + 1), once"
    )


@exercise("10_stage_backward", reference=reference_stage_backward, prompt=PROMPT)
def check_stage_backward(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a middle stage's backward inside a model split over 3 and 4 ranks.

    Args:
        fn: the learner's ``my_stage_backward(inp, out, group=None)``.

    Returns:
        ``{"world_sizes": [...]}``: the worlds checked.

    Raises:
        ExerciseFailed: a parameter's gradient differs from one process's, is missing, a
            message never arrived (a receive timed out), or the function raised.
        NotImplementedError: a rank raised it (not attempted yet; ``check`` runs the
            reference).
    """
    for p in WORLD_SIZES:
        results = launch_learner(
            _run,
            p,
            backend="gloo",
            args=(fn,),
            timeout_s=TIMEOUT_S,
            did_not_finish="on {world_size} {ranks} the step did not finish within "
            "{timeout_s:g} s:",
            hang="receive exactly one gradient from rank r + 1 and send one to rank r − 1.",
            hint=_never_came_hint,
            todo_on_any_rank=True,  # only the middle stages run the learner's code
        )
        _compare(p, results)
    return {"world_sizes": list(WORLD_SIZES)}
