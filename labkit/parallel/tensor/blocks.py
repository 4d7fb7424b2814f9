"""A tensor-parallel MLP and attention block, and their communication per step.

Introduced in notebooks/12_tensor_parallel.ipynb.

Megatron-LM (Shoeybi et al. 2019, §3, Figure 3): the MLP's first linear layer is
column-parallel and its second row-parallel, so the GELU between them acts on each rank's
slice and one all-reduce (``g``) ends the block; attention splits its heads across ranks —
``q``, ``k``, ``v`` column-parallel (each rank computes whole heads), the output projection
row-parallel. The blocks are ``labkit.models.FeedForward`` / ``SelfAttention`` /
``TransformerBlock`` with their linear layers replaced by :func:`apply_tensor_parallel`.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from labkit.parallel.tensor.apply import apply_tensor_parallel

__all__ = [
    "ATTENTION_PLAN",
    "MLP_PLAN",
    "all_reduces_per_step",
    "block_plan",
    "parallelize_attention",
    "parallelize_mlp",
]

MLP_PLAN = {"fc1": "colwise", "fc2": "rowwise"}
ATTENTION_PLAN = {"q": "colwise", "k": "colwise", "v": "colwise", "proj": "rowwise"}

# (forward, backward) all-reduces of B·T·h elements each. Backward: one ``f`` per
# column-parallel layer that reads the replicated input; q, k and v are three such layers
# (Megatron fuses them into one QKV layer, which needs a single one).
_ALL_REDUCES = {"mlp": (1, 1), "attention": (1, 3), "block": (2, 4)}


def block_plan(attn: str = "attn", mlp: str = "mlp") -> dict[str, str]:
    """The plan of a whole ``TransformerBlock``: its attention's and its MLP's, prefixed.

    Args:
        attn: name of the attention submodule.
        mlp: name of the MLP submodule.

    Returns:
        dict[str, str]: e.g. ``{"attn.q": "colwise", ..., "mlp.fc2": "rowwise"}``.
    """
    plan = {f"{attn}.{k}": v for k, v in ATTENTION_PLAN.items()}
    return plan | {f"{mlp}.{k}": v for k, v in MLP_PLAN.items()}


def parallelize_mlp(mlp: nn.Module, group: dist.ProcessGroup | None = None) -> nn.Module:
    """Make a ``FeedForward`` (``fc1`` → act → ``fc2``) tensor-parallel in place.

    Shoeybi et al. 2019, §3, Figure 3a.

    Args:
        mlp: the unsplit MLP, same weights on every rank.
        group: the tensor-parallel group (None: the default group).

    Returns:
        nn.Module: ``mlp``, ``fc1`` column-parallel and ``fc2`` row-parallel.

    Raises:
        ValueError: the hidden width is not divisible by the group size.
    """
    return apply_tensor_parallel(mlp, MLP_PLAN, group)


def parallelize_attention(attn: nn.Module, group: dist.ProcessGroup | None = None) -> nn.Module:
    """Split a ``SelfAttention``'s heads across the ranks of ``group``, in place.

    Shoeybi et al. 2019, §3, Figure 3b: each rank computes whole heads, so attention itself
    needs no communication.

    Args:
        attn: the unsplit attention (attributes ``n_heads``, ``q``, ``k``, ``v``, ``proj``).
        group: the tensor-parallel group (None: the default group).

    Returns:
        nn.Module: ``attn``, with ``n_heads / p`` heads on each rank.

    Raises:
        ValueError: ``n_heads`` is not divisible by the group size.
    """
    p = dist.get_world_size(group)
    if attn.n_heads % p:
        raise ValueError(f"{attn.n_heads} heads cannot be split over {p} ranks")
    return apply_tensor_parallel(attn, ATTENTION_PLAN, group)


def all_reduces_per_step(block: str) -> tuple[int, int]:
    """All-reduces of one tensor-parallel block per forward and per backward.

    Shoeybi et al. 2019, §3: "two all-reduce operations in the forward path and two in the
    backward path" per transformer layer, with fused QKV; our separate q, k, v add two in
    backward.

    Each moves one activation of ``B·T·h`` elements (batch, sequence, model width).

    Args:
        block: ``"mlp"``, ``"attention"`` or ``"block"`` (attention + MLP).

    Returns:
        tuple[int, int]: (forward, backward) counts; backward assumes the block's input
        needs a gradient.

    Raises:
        KeyError: an unknown block.
    """
    return _ALL_REDUCES[block]
