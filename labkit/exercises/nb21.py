"""Exercise of notebooks/21_capstone.ipynb.

Introduced in notebooks/21_capstone.ipynb.

``21_token_weighted_average``: the gradient all-reduce of the capstone's data parallelism when
the ranks hold different numbers of tokens. Each rank's loss is the mean cross-entropy over
its own target tokens (padding ignored, ``ignore_index=-100``), so its gradient is
``g_r = (1/n_r) Σ_{its tokens} ∇ℓ``. The gradient of the mean loss over the whole batch is
``Σ_r n_r g_r / Σ_r n_r``: weight each rank's gradient by its token count, sum over the ranks
and divide by the total count, which only an all-reduce of the counts gives every rank. The
plain average ``(1/d) Σ_r g_r`` (notebook 06, and what DDP does) is that only when every
``n_r`` is the same, as in the capstone's full windows. Megatron-Core does the same for the
same reason: with ``calculate_per_token_loss`` its ``finalize_model_grads(model, num_tokens)``
all-reduces the token count over the data-parallel ranks and scales the summed gradients by
its inverse.

The checker launches 2 and 3 ranks on gloo; each runs a TinyGPT forward and backward on its
own padded sequences (token counts differ from rank to rank), calls the learner's function,
and every rank's gradients must equal one process's gradient of the mean loss over all the
batch's tokens. The message says what the answer computed instead, if it is a known mistake.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner

WORLD_SIZES = (2, 3)
TIMEOUT_S = 60.0
PER_RANK, T, VOCAB = 2, 8, 11  # sequences per rank, positions, vocabulary
# Real tokens in each of the global batch's sequences (the rest is padding): ranks hold
# 11, 7 and 13 target tokens.
LENGTHS = (8, 3, 6, 1, 8, 5)
IGNORE = -100  # F.cross_entropy's default ignore_index
RTOL, ATOL = 1e-5, 1e-7

PROMPT = """Write `my_token_weighted_average(params, n_tokens, group=None)`: each rank has run
backward on the mean loss over its own `n_tokens` target tokens; make every parameter's `.grad`
(in place, on every rank) the gradient of the mean loss over all ranks' tokens: multiply by
`n_tokens`, all-reduce (sum), divide by the total token count (all-reduce it too, as a tensor
on the gradients' device)."""


def token_weighted_average(
    params: Sequence[torch.Tensor], n_tokens: int, group: dist.ProcessGroup | None = None
) -> None:
    """Make every ``.grad`` the gradient of the mean loss over all ranks' tokens.

    Reference solution of exercise ``21_token_weighted_average``: ``Σ_r n_r g_r / Σ_r n_r``
    with one all-reduce for the counts and one per parameter (a bucketed version flattens
    the gradients first, as DDP does).

    Args:
        params: this rank's parameters, after ``backward`` of its mean loss.
        n_tokens: the number of target tokens that loss averaged over on this rank.
        group: the data-parallel group (None: the default group).

    Returns:
        None; every ``.grad`` holds the weighted average afterwards.

    Raises:
        RuntimeError: from ``torch.distributed`` when the group is not initialised.
    """
    grads = [p.grad for p in params if p.grad is not None]
    # the count travels as a tensor on the gradients' device: NCCL takes no CPU tensors
    total = torch.tensor(float(n_tokens), device=grads[0].device, dtype=torch.float64)
    dist.all_reduce(total, group=group)
    for g in grads:
        g.mul_(n_tokens)
        dist.all_reduce(g, group=group)
        g.div_(total.item())


def _model() -> torch.nn.Module:
    from labkit.models import TinyGPT

    return TinyGPT(VOCAB, dim=16, n_layers=1, n_heads=2, seq_len=T, seed=17)


def _batch(world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) and next-token targets with padding marked ``IGNORE``."""
    g = torch.Generator().manual_seed(17)
    b = PER_RANK * world_size
    x = torch.randint(0, VOCAB, (b, T), generator=g)
    y = torch.randint(0, VOCAB, (b, T), generator=g)
    for i, n in enumerate(LENGTHS[:b]):
        y[i, n:] = IGNORE
    return x, y


def _loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=IGNORE)


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> dict[str, Any]:
    x, y = _batch(world_size)
    mine = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    model = _model()
    _loss(model, x[mine], y[mine]).backward()
    n_tokens = int((y[mine] != IGNORE).sum())
    local = {k: q.grad.clone() for k, q in model.named_parameters()}
    fn(list(model.parameters()), n_tokens, None)
    got = {k: None if q.grad is None else q.grad.clone() for k, q in model.named_parameters()}
    return {"n_tokens": n_tokens, "local": local, "got": got}


def _reference(world_size: int) -> dict[str, torch.Tensor]:
    """One process: the mean loss over every real token of the whole batch."""
    model = _model()
    _loss(model, *_batch(world_size)).backward()
    return {k: q.grad for k, q in model.named_parameters()}


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=RTOL, atol=ATOL)


def _hint(name: str, rank: int, results: list[dict[str, Any]]) -> str:
    """Which known mistake ``results[rank]``'s gradient of ``name`` is, in words."""
    n = [r["n_tokens"] for r in results]
    g = [r["local"][name] for r in results]
    got, total = results[rank]["got"][name], sum(n)
    weighted = sum(k * gi for k, gi in zip(n, g, strict=True))
    known = [
        (g[rank], "it is still this rank's own gradient: all-reduce it across the ranks"),
        (
            sum(g) / len(g),
            f"that is the plain average of the ranks' gradients, right only if every rank held "
            f"the same number of tokens; they hold {n}: weight each rank's gradient by its "
            "n_tokens before the sum",
        ),
        (sum(g), "that is the sum of the ranks' mean gradients: weight by n_tokens, divide"),
        (
            weighted / n[rank],
            f"it is divided by this rank's n_tokens ({n[rank]}); divide by the total over all "
            f"ranks ({total}), which needs an all-reduce of the counts",
        ),
        (weighted, f"it is the weighted sum: divide it by the total token count ({total})"),
    ]
    for value, words in known:
        if _close(got, value):
            return words
    others = [r["got"][name] for r in results]
    if any(o is None or not torch.equal(o, others[0]) for o in others):
        return "the ranks disagree: every rank needs the result (all_reduce, not reduce)"
    return "compare it with Σ_r n_r·g_r / Σ_r n_r"


def _compare(world_size: int, results: list[dict[str, Any]]) -> float:
    """Raise on the first wrong gradient; the plain average's largest error otherwise."""
    want = _reference(world_size)
    counts = [r["n_tokens"] for r in results]
    missing = [(r, k) for r, res in enumerate(results) for k in want if res["got"][k] is None]
    if missing:
        raise ExerciseFailed(
            f"on {world_size} ranks, rank {missing[0][0]}: {missing[0][1]}.grad is None "
            "afterwards; average in place (keep .grad)"
        )
    wrong = [
        (r, k) for r, res in enumerate(results) for k in want if not _close(res["got"][k], want[k])
    ]
    if wrong:
        rank, name = wrong[0]
        err = (results[rank]["got"][name] - want[name]).abs().max().item()
        raise ExerciseFailed(
            f"on {world_size} ranks holding {counts} tokens, rank {rank}: {name}.grad differs "
            f"from one process's gradient of the mean loss over all tokens (max |Δ| = "
            f"{err:.3g}): {_hint(name, rank, results)}"
        )
    plain = {k: sum(r["local"][k] for r in results) / world_size for k in want}
    return max((plain[k] - want[k]).abs().max().item() for k in want)


@exercise("21_token_weighted_average", reference=token_weighted_average, prompt=PROMPT)
def check_token_weighted_average(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check a token-weighted gradient all-reduce against one process on the whole batch.

    Args:
        fn: the learner's ``fn(params, n_tokens, group=None)``.

    Returns:
        ``{"world_sizes", "tokens", "plain_average_error"}``: the worlds checked, each one's
        tokens per rank, and the largest error the plain average of the ranks' gradients
        would have had there (the mistake this exercise is about).

    Raises:
        ExerciseFailed: a rank's gradient differs (the message names the mistake), the
            function raised, or it hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    tokens, plain_error = {}, 0.0
    for world_size in WORLD_SIZES:
        results = launch_learner(
            _run,
            world_size,
            backend="gloo",
            args=(fn,),
            timeout_s=TIMEOUT_S,
            hang="Every rank must issue the same all-reduces in the same order.",
        )
        plain_error = max(plain_error, _compare(world_size, results))
        tokens[world_size] = [r["n_tokens"] for r in results]
    return {"world_sizes": list(WORLD_SIZES), "tokens": tokens, "plain_average_error": plain_error}
