"""Moving tokens to their experts' ranks and back: all-to-all with uneven splits, differentiable.

Introduced in notebooks/17_expert_parallel.ipynb.

Under expert parallelism each rank of the ep group holds ``E/ep`` experts and routes its own
tokens; a token goes to the rank of its expert and its output comes back (GShard, Lepikhin et
al. 2020, §3.2; Switch, Fedus et al. 2021, §5.4 "Expert and Data Parallelism"). How many rows rank
``i`` sends to rank ``j`` depends on the routing, so the splits are uneven and change every
step: the ranks first **exchange their counts** (``exchange_counts``, one small all-to-all of
per-expert counts), then move the rows with those splits.

``all_to_all(x, out_splits, in_splits, group, impl)`` moves rows and is differentiable: its
backward is the same exchange with the splits swapped (a row's gradient goes back to where the
row came from). Three implementations give the same rows:

- ``"p2p"``: from scratch — one ``isend``/``irecv`` pair per peer with a non-empty split, all
  issued as one ``dist.batch_isend_irecv`` (NCCL groups them, so none waits for another; the
  rank's own rows are a local copy);
- ``"collective"``: ``dist.all_to_all_single(out, x, out_splits, in_splits)`` in labkit's
  autograd function (gloo supports uneven splits on CPU, zero-sized ones included; NCCL on GPU);
- ``"torch"``: PyTorch's own differentiable all-to-all, the functional collective
  ``torch.distributed._functional_collectives.all_to_all_single_autograd`` that torchtitan's
  expert parallelism calls (``torch.distributed.nn.functional.all_to_all_single`` does the same
  but is deprecated in torch 2.13 and warns).

The splits become Python lists (``.tolist()``): on a GPU that waits for the counts to arrive,
one host synchronisation per layer, as production MoE code does (torchtitan's expert
parallelism calls ``.tolist()`` on its exchanged counts too).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

__all__ = ["IMPLS", "all_to_all", "all_to_all_p2p", "exchange_counts"]

IMPLS = ("p2p", "collective", "torch")


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Tell every rank how many rows it will get from this one, per expert.

    Args:
        counts: ``[ep · E_local]`` int64, this rank's assignments per expert, experts of rank
            ``j`` at ``j·E_local … (j+1)·E_local − 1`` (on the rank's device).
        group: the ep group (None: the default group).

    Returns:
        torch.Tensor: ``[ep · E_local]``: at ``s·E_local + e``, the rows rank ``s`` sends to
        this rank's local expert ``e``.
    """
    received = torch.empty_like(counts)
    dist.all_to_all_single(received, counts.contiguous(), group=group)
    return received


def all_to_all_p2p(
    out: torch.Tensor,
    x: torch.Tensor,
    out_splits: Sequence[int],
    in_splits: Sequence[int],
    group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """``all_to_all_single`` from send/recv: rows ``in_splits[j]`` to rank ``j``, one batch.

    Args:
        out: ``[Σ out_splits, ...]`` receive buffer, filled in rank order.
        x: ``[Σ in_splits, ...]`` rows to send, rank-major.
        out_splits: rows to receive from each rank of ``group``.
        in_splits: rows to send to each rank of ``group``.
        group: the group (None: the default group).

    Returns:
        torch.Tensor: ``out``.
    """
    me = dist.get_rank(group)
    sends, recvs = x.split(list(in_splits)), out.split(list(out_splits))
    ops = []
    for peer in range(dist.get_world_size(group)):
        if peer == me:
            recvs[me].copy_(sends[me])
            continue
        if in_splits[peer]:
            ops.append(dist.P2POp(dist.isend, sends[peer].contiguous(), group=group,
                                  group_peer=peer))  # fmt: skip
        if out_splits[peer]:
            ops.append(dist.P2POp(dist.irecv, recvs[peer], group=group, group_peer=peer))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return out


class _AllToAll(torch.autograd.Function):
    """Rows to ranks by splits; the backward sends each row's gradient back (splits swapped)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, impl):
        ctx.splits, ctx.group, ctx.impl = (out_splits, in_splits), group, impl
        return _move(x, out_splits, in_splits, group, impl)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _move(grad, in_splits, out_splits, ctx.group, ctx.impl), None, None, None, None


def _move(x, out_splits, in_splits, group, impl) -> torch.Tensor:
    x = x.contiguous()
    out = x.new_empty((sum(out_splits), *x.shape[1:]))
    if impl == "p2p":
        return all_to_all_p2p(out, x, out_splits, in_splits, group)
    dist.all_to_all_single(out, x, list(out_splits), list(in_splits), group=group)
    return out


def all_to_all(
    x: torch.Tensor,
    out_splits: Sequence[int],
    in_splits: Sequence[int],
    group: dist.ProcessGroup | None = None,
    impl: str = "collective",
) -> torch.Tensor:
    """Send ``in_splits[j]`` rows of ``x`` to rank ``j``; receive ``out_splits[i]`` from rank ``i``.

    Differentiable: the gradient of the result goes back to the rows it came from.

    Args:
        x: ``[Σ in_splits, ...]`` rows, grouped by destination rank.
        out_splits: rows to receive from each rank (from ``exchange_counts``).
        in_splits: rows to send to each rank.
        group: the ep group (None: the default group).
        impl: ``"p2p"``, ``"collective"`` or ``"torch"`` (module docstring).

    Returns:
        torch.Tensor: ``[Σ out_splits, ...]``, grouped by source rank.

    Raises:
        ValueError: an unknown ``impl``, or splits that do not match ``x`` or the group.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    n = dist.get_world_size(group)
    if len(out_splits) != n or len(in_splits) != n or sum(in_splits) != x.shape[0]:
        raise ValueError(
            f"splits must have one entry per rank ({n}) and in_splits must sum to the rows of "
            f"x ({x.shape[0]}); got out_splits={list(out_splits)}, in_splits={list(in_splits)}"
        )
    out_splits, in_splits = [int(s) for s in out_splits], [int(s) for s in in_splits]
    if impl == "torch":
        from torch.distributed._functional_collectives import (
            all_to_all_single_autograd,
            wait_tensor,
        )

        group = group if group is not None else dist.group.WORLD
        return wait_tensor(all_to_all_single_autograd(x.contiguous(), out_splits, in_splits, group))
    return _AllToAll.apply(x, out_splits, in_splits, group, impl)
