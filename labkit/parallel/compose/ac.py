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

``mode="selective"`` checkpoints only each block's attention core (``SelfAttention.core``,
softmax(QKᵀ)·V), Korthikanti et al. 2022, §5, as Megatron-LM's ``recompute_granularity=
"selective"`` does: the block keeps everything but the s×s probabilities (or a fused kernel's
log-sum-exp) and recomputes them from the q, k and v it keeps (notebook 14 measures both modes
against ``labkit.memory.block_activation_terms``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from labkit.models import SelfAttention

__all__ = ["AC_MODES", "apply_ac", "is_checkpointed"]

_MARK = "_labkit_checkpointed"
AC_MODES = ("full", "selective")


def _checkpointed(forward: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def apply_ac(module: nn.Module, names: Iterable[str], mode: str = "full") -> nn.Module:
    """Recompute the named submodules' activations in backward instead of keeping them.

    Args:
        module: the model (or stage).
        names: submodule names (as ``named_modules``), e.g. every transformer block.
        mode: ``"full"``: each named submodule's ``forward`` runs under
            ``torch.utils.checkpoint`` (non-reentrant) and keeps only its inputs;
            ``"selective"``: only the attention core of every ``SelfAttention`` inside it
            (``SelfAttention.core``) does.

    Returns:
        ``module``, changed in place (parameter names unchanged).

    Raises:
        KeyError: a name that is not a submodule.
        ValueError: an unknown mode, a submodule already checkpointed in the other mode, or
            (selective) one without a ``SelfAttention`` inside.
    """
    if mode not in AC_MODES:
        raise ValueError(f"mode must be one of {AC_MODES}, got {mode!r}")
    modules = dict(module.named_modules())
    for name in names:
        if name not in modules:
            raise KeyError(f"{name!r} is not a submodule; submodules: {sorted(modules)[1:]}")
        block = modules[name]
        done = getattr(block, _MARK, None)
        if done == mode:
            continue
        if done is not None:
            raise ValueError(f"{name!r} is already checkpointed with mode={done!r}, not {mode!r}")
        if mode == "full":
            block.forward = _checkpointed(block.forward)
        else:
            cores = [m for m in block.modules() if isinstance(m, SelfAttention)]
            if not cores:
                raise ValueError(
                    f"{name!r} has no SelfAttention: selective recomputation checkpoints "
                    "SelfAttention.core (the attention core) and there is none to checkpoint"
                )
            for attn in cores:
                attn.core = _checkpointed(attn.core)
        setattr(block, _MARK, mode)
    return module


def is_checkpointed(module: nn.Module) -> bool:
    """Whether ``apply_ac`` made ``module`` recompute its activations (in either mode)."""
    return getattr(module, _MARK, None) is not None
