"""``apply_ac``: activation checkpointing of whole blocks, names kept.

Introduced in notebooks/18_hybrid_parallel.ipynb.

A checkpointed block keeps only its input during forward; backward runs its forward again to
rebuild what it needs (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"):
activation memory of one block per layer boundary, for about one more forward of compute.
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` does the work; it stops
recomputing as soon as backward has what it needs, so a block's last operation (e.g. the
all-reduce closing a Megatron MLP, whose output nothing saves) runs only once. torchtitan's
``apply_ac`` wraps each block in a ``CheckpointWrapper``, which renames every parameter
(``_checkpoint_wrapped_module``); here the block's own ``forward`` is replaced on the
instance, so parameter names, tensor-parallel plans and checkpoints are unchanged. Applied
after tp (the recomputation runs the split layers) and before dp (FSDP's hooks stay outside,
so the recomputation finds the parameters gathered).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

__all__ = ["apply_ac", "is_checkpointed"]

_MARK = "_labkit_checkpointed"


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_ac(module: nn.Module, names: Iterable[str]) -> nn.Module:
    """Recompute the named submodules' activations in backward instead of keeping them.

    Args:
        module: the model (or stage).
        names: submodule names (as ``named_modules``), e.g. every transformer block.

    Returns:
        ``module``; each named submodule's ``forward`` now runs under
        ``torch.utils.checkpoint`` (non-reentrant).

    Raises:
        KeyError: a name that is not a submodule.
    """
    modules = dict(module.named_modules())
    for name in names:
        if name not in modules:
            raise KeyError(f"{name!r} is not a submodule; submodules: {sorted(modules)[1:]}")
        block = modules[name]
        if getattr(block, _MARK, False):
            continue
        block.forward = _checkpointed(block.forward)
        setattr(block, _MARK, True)
    return module


def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``apply_ac`` made ``module`` recompute its activations."""
    return getattr(module, _MARK, False)
