"""``apply_tensor_parallel(model, plan, group)``: replace a model's linear layers by their shards.

Introduced in notebooks/12_tensor_parallel.ipynb.

The plan maps submodule names to a style, spelled as DTensor's
``torch.distributed.tensor.parallel.parallelize_module`` plans are (``ColwiseParallel()`` →
``"colwise"``, ``RowwiseParallel()`` → ``"rowwise"``), in the manner of torchtitan's
``apply_tp``::

    apply_tensor_parallel(mlp, {"fc1": "colwise", "fc2": "rowwise"}, group)
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["STYLES", "apply_tensor_parallel", "matching_slices"]

STYLES = {
    "colwise": lambda lin, g: ColumnParallelLinear(lin, g),
    "colwise_gather": lambda lin, g: ColumnParallelLinear(lin, g, gather_output=True),
    "rowwise": lambda lin, g: RowParallelLinear(lin, g),
    "rowwise_split": lambda lin, g: RowParallelLinear(lin, g, input_is_parallel=False),
}


def apply_tensor_parallel(
    model: nn.Module, plan: dict[str, str], group: dist.ProcessGroup | None = None
) -> nn.Module:
    """Replace each ``nn.Linear`` named in ``plan`` by its column- or row-parallel shard, in place.

    Megatron-LM (Shoeybi et al. 2019, §3), the plan spelled as DTensor's ``parallelize_module``'s.

    Args:
        model: the unsplit model, the same on every rank of ``group`` (same seed).
        plan: submodule name (dotted, as in ``named_modules``) → ``"colwise"``, ``"rowwise"``,
            ``"colwise_gather"`` (gather the output) or ``"rowwise_split"`` (split the input).
        group: the tensor-parallel group (None: the default group).

    Returns:
        nn.Module: ``model`` itself, with the named layers replaced.

    Raises:
        KeyError: a name in ``plan`` is not a submodule of ``model``.
        TypeError: a named submodule is not an ``nn.Linear``.
        ValueError: an unknown style, or a width not divisible by the group size.
    """
    modules = dict(model.named_modules())
    for name, style in plan.items():
        if style not in STYLES:
            raise ValueError(f"unknown style {style!r} for {name!r}; use one of {sorted(STYLES)}")
        if name not in modules:
            raise KeyError(f"{name!r} is not a submodule; submodules: {sorted(modules)[1:]}")
        linear = modules[name]
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"{name!r} is a {type(linear).__name__}, not an nn.Linear")
        parent_name, _, attr = name.rpartition(".")
        setattr(modules[parent_name], attr, STYLES[style](linear, group))
    return model


def matching_slices(tp_model: nn.Module, full: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """For each parameter of a tensor-parallel model, the slice of the unsplit tensor it holds.

    Pass the unsplit model's parameters (``dict(model.named_parameters())``) or gradients to
    compare every shard with them.

    Args:
        tp_model: the model after :func:`apply_tensor_parallel` (same parameter names).
        full: unsplit tensors by parameter name.

    Returns:
        dict[str, torch.Tensor]: by ``tp_model`` parameter name, the rows (column-parallel),
        columns (row-parallel weight) or whole tensor (replicated) of ``full[name]``.

    Raises:
        KeyError: a parameter of ``tp_model`` has no entry in ``full``.
    """
    out = {}
    for mod_name, mod in tp_model.named_modules():
        for p_name, _ in mod.named_parameters(recurse=False):
            name = f"{mod_name}.{p_name}" if mod_name else p_name
            t = full[name]
            if isinstance(mod, ColumnParallelLinear):
                t = t[mod.rows]
            elif isinstance(mod, RowParallelLinear) and p_name == "weight":
                t = t[:, mod.cols]
            out[name] = t
    return out
