"""Exercises of notebooks/15_sequence_parallel.ipynb.

Introduced in notebooks/15_sequence_parallel.ipynb.

``15_sp_operators``: Korthikanti et al. 2022, §4.2.2, Figure 5 — sequence parallelism's
conjugate operators on (B, T, h) tensors whose sequence is dim 1, and the step that completes
the gradients they leave partial:

- ``g``: all-gather along the sequence in forward (the ranks' slices in rank order), and
  reduce-scatter the gradient in backward (each rank's gradient of the whole sequence is a
  partial sum; each keeps the sum over its own tokens);
- ``ḡ``: reduce-scatter the row-parallel layer's partial sums in forward, all-gather the
  gradient in backward;
- the LayerNorms and the row-parallel biases act on this rank's tokens only, so their
  gradients are partial sums over the ranks: one all-reduce (sum) completes them.

The checker runs the three on 2 ranks over the recording backend, with data that differs along
the sequence and from rank to rank: each operator alone (its values and the collectives it
issues, forward and backward), then a sequence-parallel transformer block built from them,
compared with the unsplit block in one process — output, input gradient and every parameter
gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner
from labkit.parallel.sequence import gather_from_sequence, reduce_scatter_to_sequence, sum_coalesced

WORLD_SIZE = 2
TIMEOUT_S = 60.0
B, T, H, HEADS, HIDDEN = 2, 4, 8, 2, 16  # batch, sequence, width, heads, MLP width
RTOL, ATOL = 1e-5, 1e-6  # float32, sums in another order
GATHER = ("all_gather", "all_gather_into_tensor")
SCATTER = ("reduce_scatter", "reduce_scatter_tensor")
COLUMNS = ("attn.q", "attn.k", "attn.v", "mlp.fc1")  # column-parallel: output rows split
ROWS = ("attn.proj.weight", "mlp.fc2.weight")  # row-parallel: input columns split
PARTIAL = ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn.proj.bias", "mlp.fc2.bias")

PROMPT = """Write sequence parallelism's operators for tensors (B, T, h) whose sequence is dim 1,
each with a `group` argument (None: the default group), and pass the three as a tuple:

- `my_g(x, group=None)`: forward all-gathers every rank's (B, T/p, h) slice into (B, T, h), the
  slices in rank order; backward reduce-scatters the (B, T, h) gradient along dim 1, so that
  rank r gets the sum over ranks of tokens [r·T/p, (r+1)·T/p);
- `my_gbar(x, group=None)`: forward reduce-scatters a (B, T, h) partial sum along dim 1
  (rank r keeps the sum of its tokens); backward all-gathers the gradient;
- `my_reduce_grads(grads, group=None)`: sums each tensor of the list `grads` over the group, in
  place (the LayerNorms' and the row-parallel biases' gradients are partial sums).

Write `my_g` and `my_gbar` with `torch.autograd.Function`s."""


def reference_g(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Korthikanti's ``g``: all-gather along dim 1 forward, reduce-scatter backward.

    Args:
        x: (B, T/p, h), this rank's tokens.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: (B, T, h), the same on every rank.
    """
    return gather_from_sequence(x, group)


def reference_gbar(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Korthikanti's ``ḡ``: reduce-scatter along dim 1 forward, all-gather backward.

    Args:
        x: (B, T, h), this rank's partial sum.
        group: the tensor-parallel group (None: the default group).

    Returns:
        torch.Tensor: (B, T/p, h), the sum over the ranks of this rank's tokens.
    """
    return reduce_scatter_to_sequence(x, group)


def reference_reduce_grads(
    grads: list[torch.Tensor], group: dist.ProcessGroup | None = None
) -> None:
    """Sum each gradient over ``group`` in place, as one all-reduce of a flat buffer.

    Args:
        grads: the partial gradients (LayerNorms, row-parallel biases).
        group: the tensor-parallel group (None: the default group).

    Returns:
        None.
    """
    sum_coalesced(grads, group)


REFERENCE = (reference_g, reference_gbar, reference_reduce_grads)


def _block():
    from labkit.models import TransformerBlock

    return TransformerBlock(H, HEADS, hidden=HIDDEN, seed=15)


def _tensor(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _x() -> torch.Tensor:
    return _tensor(150, (B, T, H))  # every token different: a wrong order shows


def _w() -> torch.Tensor:
    return _tensor(151, (B, T, H))  # the loss's weights


def _per_rank(seed: int, rank: int, shape: tuple[int, ...]) -> torch.Tensor:
    return _tensor(1000 * seed + rank, shape)  # different on every rank: asymmetric


def _mine(rank: int, world_size: int) -> slice:
    n = T // world_size
    return slice(rank * n, (rank + 1) * n)


def _shard(name: str, t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This rank's part of parameter ``name`` (heads and MLP columns split; the rest whole)."""
    if name.rsplit(".", 1)[0] in COLUMNS:
        return t.chunk(world_size, 0)[rank]
    if name in ROWS:
        return t.chunk(world_size, 1)[rank]
    return t


def _sp_block(x: torch.Tensor, P: dict[str, torch.Tensor], g: Callable, gbar: Callable):
    """The pre-norm block on this rank's tokens (B, T/p, h), with the learner's g and ḡ."""
    a = g(F.layer_norm(x, (H,), P["ln1.weight"], P["ln1.bias"]))  # (B, T, h)
    qkv = [F.linear(a, P[f"attn.{n}.weight"], P[f"attn.{n}.bias"]) for n in "qkv"]
    q, k, v = (t.unflatten(-1, (-1, H // HEADS)).transpose(1, 2) for t in qkv)  # this rank's heads
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)
    x = x + gbar(F.linear(y, P["attn.proj.weight"])) + P["attn.proj.bias"]
    u = g(F.layer_norm(x, (H,), P["ln2.weight"], P["ln2.bias"]))
    u = F.linear(F.gelu(F.linear(u, P["mlp.fc1.weight"], P["mlp.fc1.bias"])), P["mlp.fc2.weight"])
    return x + gbar(u) + P["mlp.fc2.bias"]


def _ops(start: int) -> list[str]:
    from labkit.backends import recording

    return [r.op.removesuffix("_coalesced") for r in recording.records()[start:]]


def _n_ops() -> int:
    from labkit.backends import recording

    return len(recording.records())


def _stage(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run one stage; an error (but 'not written yet') becomes the stage's result."""
    try:
        return fn()
    except NotImplementedError:
        raise
    except Exception as exc:  # noqa: BLE001 - the learner's error, reported with a hint
        return {"error": f"{type(exc).__name__}: {exc}"}


def _operator(op: Callable, x: torch.Tensor, grad: torch.Tensor) -> dict[str, Any]:
    """The operator's forward output and its input's gradient, with the ops of each pass."""
    x = x.clone().requires_grad_(True)
    start = _n_ops()
    y = op(x)
    out = {"y": y.detach(), "fwd": _ops(start)}
    start = _n_ops()
    back = _stage(lambda: y.backward(grad) or {})
    if "error" in back:
        return out | {"bwd_error": back["error"]}
    return out | {"x_grad": x.grad, "bwd": _ops(start)}


def _block_run(rank: int, world_size: int, g, gbar, reduce_grads) -> dict[str, Any]:
    mine = _mine(rank, world_size)
    P = {
        n: _shard(n, q.detach(), rank, world_size).clone().requires_grad_(True)
        for n, q in _block().named_parameters()
    }
    x = _x()[:, mine].clone().requires_grad_(True)
    start = _n_ops()
    y = _sp_block(x, P, g, gbar)
    (y * _w()[:, mine]).sum().backward()
    partial = {n: P[n].grad.clone() for n in PARTIAL}
    middle = _n_ops()
    reduce_grads([P[n].grad for n in PARTIAL])
    grads = {n: q.grad for n, q in P.items()}
    ops, reduce_ops = _ops(start)[: middle - start], _ops(middle)
    return {"y": y.detach(), "x_grad": x.grad, "grads": grads, "partial": partial,
            "ops": ops, "reduce_ops": reduce_ops}  # fmt: skip


def _run(rank: int, world_size: int, answer: tuple[Callable, Callable, Callable]) -> dict:
    g, gbar, reduce_grads = answer
    mine, t = _mine(rank, world_size), T // world_size
    x, partial = _x()[:, mine], _per_rank(2, rank, (B, T, H))
    return {
        "g": _stage(lambda: _operator(g, x, _per_rank(1, rank, (B, T, H)))),
        "gbar": _stage(lambda: _operator(gbar, partial, _per_rank(3, rank, (B, t, H)))),
        "block": _stage(lambda: _block_run(rank, world_size, g, gbar, reduce_grads)),
    }


def _close(a: Any, b: torch.Tensor) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a, b, RTOL, ATOL)


def _require(ok: bool, rank: int, what: str, hint: str = "") -> None:
    if not ok:
        raise ExerciseFailed(f"on {WORLD_SIZE} ranks, rank {rank}: {what}; {hint}".rstrip("; "))


ORDER = "rank r holds tokens [r·T/p, (r+1)·T/p): keep the slices in rank order."
TWICE = "an all-reduce and a split get the right numbers but send twice the bytes of the "
TWICE += "reduce-scatter that is needed."


def _check_g(rank: int, res: dict[str, Any]) -> None:
    p, mine = WORLD_SIZE, _mine(rank, WORLD_SIZE)
    _require("error" not in res, rank, f"my_g raised {res.get('error')}",
             "its forward takes (B, T/p, h) and returns (B, T, h).")  # fmt: skip
    x, y = _x(), res["y"]
    _require(tuple(y.shape) != (p * B, T // p, H), rank, f"my_g returned {tuple(y.shape)}: it "
             "gathered along the batch (dim 0)", "the sequence is dim 1.")  # fmt: skip
    _require(not _close(y, torch.cat(x.chunk(p, dim=1)[::-1], dim=1)), rank,
             "my_g's output has the ranks' tokens in the wrong order", ORDER)  # fmt: skip
    _require(_close(y, x), rank, "my_g's output is not the whole sequence (B, T, h)",
             "all-gather every rank's slice along dim 1.")  # fmt: skip
    _require(any(op in GATHER for op in res["fwd"]) and "all_reduce" not in res["fwd"], rank,
             f"my_g's forward issued {res['fwd']}", "all-gather the slices.")  # fmt: skip
    _require("bwd_error" not in res, rank, f"my_g's backward raised {res.get('bwd_error')}",
             "it returns a gradient shaped like the input, (B, T/p, h): reduce-scatter "
             "along dim 1.")  # fmt: skip
    grads = [_per_rank(1, r, (B, T, H)) for r in range(p)]
    want, got = sum(grads)[:, mine], res["x_grad"]
    _require(not _close(got, grads[rank][:, mine]), rank, "my_g's backward kept only this "
             "rank's part of the gradient (a split)", "each rank's gradient of the whole "
             "sequence is a partial sum (its own heads or columns read every token): "
             "reduce-scatter (sum) it along dim 1.")  # fmt: skip
    _require(not _close(got, want / p), rank, "my_g's backward averaged the gradient",
             "sum it.")  # fmt: skip
    _require(_close(got, want), rank, "my_g's backward gradient differs", "reduce-scatter it "
             "along dim 1: rank r gets the sum over ranks of its tokens.")  # fmt: skip
    _require(any(op in SCATTER for op in res["bwd"]) and "all_reduce" not in res["bwd"], rank,
             f"my_g's backward issued {res['bwd']}", TWICE)  # fmt: skip


def _check_gbar(rank: int, res: dict[str, Any]) -> None:
    p, mine = WORLD_SIZE, _mine(rank, WORLD_SIZE)
    _require("error" not in res, rank, f"my_gbar raised {res.get('error')}",
             "its forward takes (B, T, h) and returns (B, T/p, h).")  # fmt: skip
    total, y = sum(_per_rank(2, r, (B, T, H)) for r in range(p)), res["y"]
    _require(not _close(y, total), rank, "my_gbar returned the whole sum (B, T, h)",
             "ḡ reduce-scatters: rank r keeps the sum of its own tokens only.")  # fmt: skip
    other = _mine(p - 1 - rank, p)
    _require(not (_close(y, total[:, other]) and other != mine), rank,
             "my_gbar kept another rank's tokens", ORDER)  # fmt: skip
    _require(_close(y, total[:, mine]), rank, "my_gbar's output differs",
             "reduce-scatter (sum) along dim 1, the sequence.")  # fmt: skip
    _require(any(op in SCATTER for op in res["fwd"]) and "all_reduce" not in res["fwd"], rank,
             f"my_gbar's forward issued {res['fwd']}", TWICE)  # fmt: skip
    _require("bwd_error" not in res, rank, f"my_gbar's backward raised {res.get('bwd_error')}",
             "it returns (B, T, h): all-gather the gradient along dim 1.")  # fmt: skip
    grads = [_per_rank(3, r, (B, T // p, H)) for r in range(p)]
    _require(_close(res["x_grad"], torch.cat(grads, dim=1)), rank, "my_gbar's backward "
             "gradient differs", "all-gather the (B, T/p, h) gradients along dim 1, in rank "
             "order: the whole partial sum fed every token.")  # fmt: skip


def _reference() -> dict[str, Any]:
    block, x = _block(), _x().requires_grad_(True)
    y = block(x)
    (y * _w()).sum().backward()
    grads = {n: q.grad for n, q in block.named_parameters()}
    return {"y": y.detach(), "x_grad": x.grad, "grads": grads}


def _check_block(rank: int, res: dict[str, Any], ref: dict[str, Any]) -> None:
    p, mine = WORLD_SIZE, _mine(rank, WORLD_SIZE)
    _require("error" not in res, rank, f"the block raised {res.get('error')}",
             "my_reduce_grads sums each tensor of the list over the group, in place.")  # fmt: skip
    same = _close(res["y"], ref["y"][:, mine]) and _close(res["x_grad"], ref["x_grad"][:, mine])
    _require(same, rank, "the block's output or input gradient differs from the unsplit block's")
    for name, got in res["grads"].items():
        want = _shard(name, ref["grads"][name], rank, p)
        if name in PARTIAL:
            _require(not _close(got, res["partial"][name]), rank, f"{name}'s gradient is this "
                     "rank's partial sum (not reduced)", "the LayerNorms and the row-parallel "
                     "biases see only this rank's tokens: my_reduce_grads must sum their "
                     "gradients over the ranks, in place.")  # fmt: skip
            _require(not _close(got, want / p), rank, f"{name}'s gradient is the average over "
                     "ranks", "sum it: each rank's part covers different tokens.")  # fmt: skip
        _require(_close(got, want), rank, f"{name}'s gradient differs from the unsplit block's")
    _require("all_reduce" not in res["ops"], rank, f"the block issued {res['ops']}",
             "sequence parallelism all-gathers and reduce-scatters instead.")  # fmt: skip
    _require(bool(res["reduce_ops"]), rank, "my_reduce_grads issued no collective")


@exercise("15_sp_operators", reference=REFERENCE, prompt=PROMPT)
def check_sp_operators(answer: tuple[Callable, Callable, Callable]) -> dict[str, Any]:
    """Check the learner's ``(g, ḡ, reduce_grads)`` alone and in a sequence-parallel block.

    Args:
        answer: ``(my_g, my_gbar, my_reduce_grads)``.

    Returns:
        ``{"world_size": 2, "ops": [...]}``: the ranks checked and rank 0's block collectives.

    Raises:
        ExerciseFailed: an operator's values, shape, rank order or collectives are wrong, the
            LayerNorm (or row-bias) gradients are not summed over the ranks, a function raised,
            or the ranks hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    if not isinstance(answer, tuple | list) or len(answer) != 3:
        raise ExerciseFailed("pass a tuple of three functions: (my_g, my_gbar, my_reduce_grads)")
    results = launch_learner(
        _run,
        WORLD_SIZE,
        backend="labkit_record",
        args=(tuple(answer),),
        timeout_s=TIMEOUT_S,
        hang="Every rank must issue the same collectives in the same order.",
    )
    ref = _reference()
    for rank, res in enumerate(results):
        _check_g(rank, res["g"])
    for rank, res in enumerate(results):
        _check_gbar(rank, res["gbar"])
    for rank, res in enumerate(results):
        _check_block(rank, res["block"], ref)
    return {"world_size": WORLD_SIZE, "ops": results[0]["block"]["ops"]}
