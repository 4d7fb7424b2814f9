"""Exercises of notebooks/17_expert_parallel.ipynb.

Introduced in notebooks/17_expert_parallel.ipynb.

``17_ep_gradients``: the gradient reduction of expert parallelism inside data parallelism
(EP × DP, as torchtitan composes them). After each rank's backward of its own mean loss, the
learner's ``reduce_ep_gradients(model, dp, edp)`` must leave every gradient equal to one
process's gradient of the mean loss over all dp ranks' tokens: the dense layers and the router
summed over the dp group, the experts over the expert-dp group (the ranks holding the same
experts), both divided by the dp degree — an expert's gradient on a rank already holds every
token of its ep group (the all-to-all's backward brought them back), so the expert-dp sum
counts each dp rank once.

The checker runs a small model (a linear layer, a top-1 MoE layer with 4 experts and a
residual, a linear head) on 4 ranks, dp = 4 and ep = 2, over the recording backend, and
compares every rank's gradients with one process. Its data leave some experts without a token
in one ep group but not in the other; on those ranks the experts' ``.grad`` is ``None``, as MoE
code that skips idle experts leaves it. It names the mistake it recognises: averaging the
experts over expert-dp (``ep``× too large), reducing them over the whole dp group (other
experts' gradients mixed in), dense gradients not divided by dp, experts without tokens left
out of the reduction; and it checks the recorded all-reduces — each gradient once, over its
group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import launch_learner
from labkit.parallel.dims import ParallelDims
from labkit.parallel.moe import (
    MoELayer,
    apply_ep,
    expert_parameters,
    load_balancing_loss,
    reduce_ep_gradients,
)

WORLD_SIZE, EP = 4, 2  # dp = 4 ranks, ep groups of 2: experts 0-1 on even ranks, 2-3 on odd
T, D_IN, D, D_FF, N_EXPERTS, N_CLASSES = 8, 6, 8, 16, 4, 3  # tokens per rank, widths
SEED = 7  # data in which experts 1 and 3 get no token from one ep group and some from the other
ALPHA = 0.01  # Switch's aux-loss coefficient
TIMEOUT_S = 90.0
RTOL, ATOL = 1e-5, 1e-6

PROMPT = """Write `my_reduce_ep_gradients(model, dp, edp)`. Each rank of a data-parallel group
`dp` trained on its own tokens and ran `backward()` of its own mean loss; the model's MoE layers
are expert-parallel (`lk.parallel.moe.apply_ep`): each rank holds some of the experts
(`lk.parallel.moe.expert_parameters(model)` lists them) and the ranks holding the same experts
form the expert-dp group `edp`. The router and the other layers are replicated over `dp`. Make
every gradient equal to one process's gradient of the mean loss over all ranks' tokens. An
expert that no token of this rank's ep group reached has `.grad = None` (MoE code that skips
idle experts leaves it so) — another rank may hold a gradient for it; every parameter must end
with a gradient (zeros where no token reached). The check runs dp = 4, ep = 2 on 4 ranks."""


class EPNet(nn.Module):
    """in_proj → h + MoE(h) (a dropped token passes through) → head: dense and expert parts."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        self.in_proj, self.head = nn.Linear(D_IN, D), nn.Linear(D, N_CLASSES)
        self.moe = MoELayer(D, N_EXPERTS, D_FF, top_k=1, capacity_factor=1.0, seed=SEED)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.in_proj(x)
        return self.head(h + self.moe(h))


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch: ``T`` tokens per rank, rank-major."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(WORLD_SIZE * T, D_IN, generator=g)
    return x, torch.randint(0, N_CLASSES, (WORLD_SIZE * T,), generator=g)


def reference() -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """One process: each rank's tokens a routing group, the mean of the ranks' losses.

    Returns:
        ``(grads, kept)``: every parameter's gradient (zeros where none), and per rank the
        assignments each expert kept.
    """
    model, (x, y) = EPNet(), batch()
    losses, kept = [], []
    for xs, ys in zip(x.chunk(WORLD_SIZE), y.chunk(WORLD_SIZE), strict=True):
        out = model(xs)
        r = model.moe.routing[0]
        losses.append(F.cross_entropy(out, ys) + ALPHA * load_balancing_loss(r.probs, r.experts))
        kept.append(r.tokens_per_expert().tolist())
    torch.stack(losses).mean().backward()
    grads = {n: p.grad if p.grad is not None else torch.zeros_like(p)
             for n, p in model.named_parameters()}  # fmt: skip
    return grads, kept


def _run(rank: int, world_size: int, fn: Callable[..., Any]) -> dict[str, Any]:
    from labkit.backends import recording

    ep_groups, edp_groups = ParallelDims(dp=world_size).expert_groups(EP)
    dp = dist.new_group(list(range(world_size)))
    groups = {tuple(g): dist.new_group(g) for g in ep_groups + edp_groups}  # every rank, in order
    ep = groups[tuple(next(g for g in ep_groups if rank in g))]
    edp = groups[tuple(next(g for g in edp_groups if rank in g))]
    model = EPNet()
    names = {id(p): n for n, p in model.named_parameters()}  # names in the whole model
    apply_ep(model, ep)
    x, y = (t.chunk(world_size)[rank] for t in batch())
    loss = F.cross_entropy(model(x), y) + ALPHA * model.moe.aux_loss
    loss.backward()
    layer = model.moe
    for e, n_rows in enumerate(layer.received.sum(dim=0).tolist()):
        if n_rows == 0:  # an idle expert: no gradient, as code that skips it would leave
            for p in layer.experts[e].parameters():
                p.grad = None
    before = {names[id(p)]: None if p.grad is None else p.grad.clone() for p in model.parameters()}
    recording.clear()
    fn(model, dp, edp)
    ops = [(r.op, r.n_bytes, len(r.participants)) for r in recording.records()]
    after = {names[id(p)]: None if p.grad is None else p.grad.detach().clone()
             for p in model.parameters()}  # fmt: skip
    dist.barrier()
    return {
        "before": before,
        "after": after,
        "experts": [names[id(p)] for p in expert_parameters(model)],
        "ops": ops,
    }


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    return a is not None and a.shape == b.shape and torch.allclose(a, b, rtol=RTOL, atol=ATOL)


def _expert_of(name: str) -> int:
    return int(name.split(".")[2])  # "moe.experts.<e>.fc1.weight"


def _whole_dp(results: list[dict], rank: int, name: str) -> torch.Tensor:
    """What reducing this rank's flat expert buffer over all dp ranks would give: the sum,
    position by position, of every rank's local experts (other experts on other ranks) / dp."""
    n_local = N_EXPERTS // EP
    i, rest = _expert_of(name) % n_local, name.split(".", 3)[3]
    parts = []
    for s, res in enumerate(results):
        g = res["before"][f"moe.experts.{(s % EP) * n_local + i}.{rest}"]
        parts.append(torch.zeros_like(results[rank]["after"][name]) if g is None else g)
    return torch.stack(parts).sum(0) / len(results)


def _diagnose(results: list[dict], rank: int, name: str, want: torch.Tensor) -> str:
    got, dp_size = results[rank]["after"][name], len(results)
    expert = name in results[rank]["experts"]
    what = f"rank {rank}'s gradient of {name}"
    if got is None:
        peers = [s for s in range(rank % EP, dp_size, EP) if results[s]["before"][name] is not None]
        where = f" (rank {peers[0]} holds one)" if peers else ""
        return (
            f"{what} is None after your reduction. This rank's ep group sent that expert no "
            f"token, but its expert-dp peers may have{where}: an expert without tokens still "
            "takes part in its group's reduction, with a zero gradient"
        )
    if want.abs().max() > 10 * ATOL:
        if _close(got, dp_size * want):
            return (
                f"{what} is {dp_size}× too large: summed over the ranks but not divided by "
                f"dp = {dp_size}. The loss is the mean over all {dp_size} dp ranks' tokens"
            )
        if expert and _close(got, EP * want):
            return (
                f"{what} is {EP}× too large: averaging over the expert-dp group divides by its "
                f"{dp_size // EP} ranks, but an expert's gradient on a rank already holds the "
                f"tokens of its whole ep group ({EP} ranks; the all-to-all's backward brought "
                f"them back): the expert-dp sum covers each dp rank once, divide it by dp"
            )
        if expert and _close(got, _whole_dp(results, rank, name)):
            return (
                f"{what} mixes in other experts' gradients: the ranks of one dp group hold "
                "different experts (ep), so reducing the experts over the whole dp group adds, "
                "say, expert 2's gradient to expert 0's. Reduce the experts over the expert-dp "
                "group, the ranks that hold the same experts"
            )
        before = results[rank]["before"][name]
        if before is not None and _close(got, before):
            return f"{what} is unchanged: it was not reduced over its group"
    err = (got - want).abs().max().item()
    return f"{what} differs from one process's (max |Δ| = {err:.3g})"


def _check_ops(results: list[dict], rank: int, n_params: dict[str, int]) -> None:
    res = results[rank]
    n_expert = sum(n_params[n] for n in res["experts"])
    n_dense = sum(n_params.values()) - sum(
        n_params[n] for n in n_params if n.startswith("moe.experts.")
    )
    by_size: dict[int, int] = {}
    for op, n_bytes, k in res["ops"]:
        if op.startswith("all_reduce"):
            by_size[k] = by_size.get(k, 0) + n_bytes
    want = {len(results): 4 * n_dense, len(results) // EP: 4 * n_expert}
    if by_size != want:
        raise ExerciseFailed(
            f"the gradients are right, but rank {rank} all-reduced {by_size} bytes per group "
            f"size; reducing each gradient once over its group moves {want}: the dense "
            f"gradients ({n_dense} floats) over the {len(results)} dp ranks, this rank's experts "
            f"({n_expert} floats) over their {len(results) // EP} expert-dp ranks"
        )


def _hint(cause: str) -> str:
    return (
        ". Every rank of a group must issue the same all-reduces with buffers of the same size: "
        "an expert that got no token on one rank (its .grad is None) still takes part, with a "
        "zero gradient"
    )


@exercise("17_ep_gradients", reference=reduce_ep_gradients, prompt=PROMPT)
def check_ep_gradients(fn: Callable[..., Any]) -> dict[str, Any]:
    """Check an EP × DP gradient reduction on 4 ranks against one process.

    Args:
        fn: the learner's ``fn(model, dp, edp)``, reducing ``.grad`` in place.

    Returns:
        ``{"world_size": 4, "ep": 2, "idle_experts": {rank: [expert, ...]}}``: what was checked.

    Raises:
        ExerciseFailed: a gradient differs from one process's (naming the mistake when it is a
            known one), is left None, the all-reduces are not one per gradient over its group,
            a rank raised, or the ranks hung.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    results = launch_learner(
        _run,
        WORLD_SIZE,
        backend="labkit_record",
        args=(fn,),
        timeout_s=TIMEOUT_S,
        hang=(
            "Every rank of a group must issue the same all-reduces: an expert with no token "
            "(its .grad is None) still takes part, with a zero gradient."
        ),
        hint=_hint,
    )
    want, _ = reference()
    n_params = {n: g.numel() for n, g in want.items()}
    for rank, res in enumerate(results):
        for name, g in res["after"].items():
            if not _close(g, want[name]):
                raise ExerciseFailed(_diagnose(results, rank, name, want[name]))
    for rank in range(len(results)):
        _check_ops(results, rank, n_params)
    idle = {
        rank: sorted({_expert_of(n) for n in res["experts"] if res["before"][n] is None})
        for rank, res in enumerate(results)
    }
    return {"world_size": WORLD_SIZE, "ep": EP, "idle_experts": idle}
