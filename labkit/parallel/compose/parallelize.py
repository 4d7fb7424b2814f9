"""``parallelize``: the one chain of ``apply_*`` calls, each gated by the degrees, in one order.

Introduced in notebooks/18_hybrid_parallel.ipynb (the order and why: ``labkit.parallel.compose``).

torchtitan's ``parallelize_llama`` in miniature: ``if parallel_dims.tp_enabled: apply_tp(...)``,
then activation checkpointing, then ``apply_fsdp`` or ``apply_ddp`` on the dp mesh, after
``pipeline_llama`` has cut the stage. The result, ``Parallelized``, is what a training loop
needs whatever the strategy: the module to run, the ``Piece`` objects the optimizer updates (named
as in the unsplit model), the object that reduces the gradients, and the chain of calls made
(``chain``, printed by notebooks 18 and 21).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.mesh import axis_group
from labkit.parallel.compose.ac import apply_ac
from labkit.parallel.compose.dp import apply_ddp, apply_fsdp, apply_zero
from labkit.parallel.compose.pieces import Piece
from labkit.parallel.compose.pp import PipelineStage, apply_pp
from labkit.parallel.compose.sp import apply_sp, reduce_sp_gradients
from labkit.parallel.compose.tp import TP_STYLES, apply_tp, tp_split
from labkit.parallel.dims import ParallelDims
from labkit.parallel.pipeline.split import split_sequential
from labkit.parallel.zero import ZeroBase

__all__ = ["DP_FLAVOURS", "Parallelized", "parallelize"]

DP_FLAVOURS = ("ddp", "zero1", "zero2", "zero3", "fsdp")
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Parallelized:
    """One rank's share of a model after ``parallelize``, with what a training loop needs.

    Attributes:
        dims: the degrees.
        mesh: the ``DeviceMesh`` of the run (axes of degree > 1).
        module: what runs the forward: the model (tensor-parallel, FSDP2 or wrapped in DDP).
            Under pp, the stage (``pipeline.module``).
        model: the unwrapped model, or the stage's layers under pp.
        pieces: what this rank's optimizer updates, named as in the unsplit model.
        chain: the ``apply_*`` calls made, in order, as code.
        zero: the ZeRO stage when the dp flavour is ZeRO (it is the optimizer).
        pipeline: this rank's ``PipelineStage`` when pp > 1.
        optimizer_kwargs: Adam's arguments (given to ZeRO's Adam at construction).
        sp_style: the tp style when sequence parallelism is on (its LayerNorms' gradients are
            reduced over tp in ``reduce_gradients``); None: off.
    """

    dims: ParallelDims
    mesh: Any
    module: nn.Module
    model: nn.Module
    pieces: list[Piece]
    chain: list[str]
    zero: ZeroBase | None = None
    pipeline: PipelineStage | None = None
    optimizer_kwargs: dict[str, Any] = field(default_factory=dict)
    sp_style: str | None = None

    @property
    def reducer(self) -> Any:
        """What reduces the gradients over dp (for ``no_sync``): ZeRO, the DDP or FSDP2 module."""
        return self.zero if self.zero is not None else self.module

    @property
    def params(self) -> list[torch.Tensor]:
        """The tensors the optimizer updates (the pieces' ``param``)."""
        return [p.param for p in self.pieces]

    def make_adam(self) -> torch.optim.Optimizer:
        """Adam over the pieces with ``optimizer_kwargs`` (ZeRO's own Adam under ZeRO)."""
        if self.zero is not None:
            return self.zero.optimizer
        return torch.optim.Adam(self.params, **self.optimizer_kwargs)

    def reduce_gradients(self) -> None:
        """Finish the reductions backward leaves: SP's LayerNorm gradients (tp), ZeRO-1's (dp)."""
        if self.sp_style is not None:
            tp = self.mesh["tp"] if self.sp_style == "dtensor" else axis_group(self.mesh, "tp")
            reduce_sp_gradients(self.model, tp, self.sp_style)
        if self.zero is not None:
            self.zero.reduce_gradients()

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """The optimizer step (ZeRO's: Adam on the shards, then its all-gathers)."""
        if self.zero is not None:
            self.zero.step()
        else:
            optimizer.step()

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients in place (DDP's bucket views stay views)."""
        if self.zero is not None:
            self.zero.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=False)

    def evaluate(
        self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, context: Callable | None = None
    ) -> float | None:
        """The loss of one forward, no gradients.

        Args:
            x, y: this rank's share of a batch.
            loss_fn: the mean loss of a batch.
            context: entered around the forward (e.g. autocast); None: nothing.

        Returns:
            The loss (None on pipeline ranks that do not compute it).
        """
        if self.pipeline is not None:
            return self.pipeline.evaluate(x, y, loss_fn, context)
        with torch.no_grad(), (context or contextlib.nullcontext)():
            return float(loss_fn(self.module(x), y))


def _check(
    dims: ParallelDims, dp: str, tp_plan: Any, tp_style: str, example: Any, sp: bool
) -> None:
    problems = []
    if dp not in DP_FLAVOURS:
        problems.append(f"dp flavour must be one of {DP_FLAVOURS}, got {dp!r}")
    if tp_style not in TP_STYLES:
        problems.append(f"tp_style must be one of {TP_STYLES}, got {tp_style!r}")
    if dims.dp_enabled and dp.startswith("zero") and (dims.pp_enabled or dims.tp_enabled):
        problems.append(f"labkit's {dp} shards only pure data parallelism (pp = tp = 1)")
    if dims.dp_enabled and dp == "fsdp" and dims.pp_enabled:
        problems.append("FSDP2 × PP: labkit's pipeline runtime holds back DDP only")
    if dims.dp_enabled and dims.tp_enabled and dp == "fsdp" and tp_style != "dtensor":
        problems.append("FSDP2 composes with DTensor TP only: tp_style='dtensor'")
    if dims.dp_enabled and dims.tp_enabled and dp == "ddp" and tp_style == "dtensor":
        problems.append("labkit's DDP buckets plain tensors: use tp_style='megatron' with DDP")
    if dims.tp_enabled and not tp_plan and not sp:
        problems.append("tp > 1 needs a tp_plan (or sp=True on transformer blocks)")
    if sp and dims.tp_enabled and dims.pp_enabled:
        problems.append("sequence parallelism × PP: labkit's stages pass whole sequences")
    if sp and dims.tp_enabled and dims.dp_enabled and dp == "fsdp":
        problems.append("FSDP2 × sequence parallelism is not composed here (DDP is)")
    if dims.pp_enabled and example is None:
        problems.append("pp > 1 needs an example input (the stages' shapes)")
    if problems:
        raise ValueError(f"cannot parallelize {dims.label} with dp={dp!r}: " + "; ".join(problems))


def _ranks(group: dist.ProcessGroup) -> list[int]:
    return dist.get_process_group_ranks(group)


def parallelize(
    model: nn.Module,
    dims: ParallelDims,
    mesh: Any,
    *,
    dp: str = "ddp",
    tp_plan: dict[str, str] | None = None,
    tp_style: str = "megatron",
    sp: bool = False,
    ac: Iterable[str] = (),
    microbatches: int = 1,
    example: torch.Tensor | None = None,
    split: Callable[[nn.Sequential, int], list[nn.Sequential]] = split_sequential,
    bucket_cap_mb: float = 25.0,
    optimizer_kwargs: dict[str, Any] | None = None,
) -> Parallelized:
    """Apply pp, tp, ac and dp to ``model`` in that order, each only where its degree is > 1.

    Args:
        model: the whole model, the same on every rank, on this rank's device; an
            ``nn.Sequential`` when pp > 1.
        dims: the degrees (``dims.world_size`` ranks).
        mesh: ``labkit.mesh.build_mesh(dims)``.
        dp: ``"ddp"``, ``"zero1"``, ``"zero2"``, ``"zero3"`` or ``"fsdp"`` (used when dp > 1).
        tp_plan: submodule name (in the whole model) → ``"colwise"`` / ``"rowwise"``.
        tp_style: ``"megatron"`` (labkit's layers) or ``"dtensor"`` (``parallelize_module``).
        sp: sequence parallelism on the tp axis (when tp > 1): ``apply_sp`` makes every
            transformer block (``ln1``, ``attn``, ``ln2``, ``mlp``) tensor- and
            sequence-parallel instead of ``apply_tp`` with ``tp_plan``.
        ac: names of the submodules to checkpoint (in the whole model), e.g. the blocks.
        microbatches: pipeline micro-batches per step (pp > 1).
        example: one input batch, to find the stages' activation shapes (pp > 1).
        split: how to cut the model into stages (pp > 1).
        bucket_cap_mb: DDP's bucket cap.
        optimizer_kwargs: Adam's arguments (needed now by ZeRO, which is its own optimizer).

    Returns:
        The ``Parallelized`` share of this rank.

    Raises:
        ValueError: a combination this layer does not compose (the message says why).
    """
    _check(dims, dp, tp_plan, tp_style, example, sp)
    kwargs, chain = dict(optimizer_kwargs or {}), []
    pipeline, names = None, {n: True for n in ac}
    if dims.pp_enabled:  # 1. pp: keep this rank's stage; later steps see only its layers
        pipeline = apply_pp(model, axis_group(mesh, "pp"), microbatches, example, split)
        a, b = pipeline.first_layer, pipeline.first_layer + len(pipeline.layers)
        chain.append(
            f'stage = apply_pp(model, mesh["pp"], microbatches={microbatches})  '
            f"# stage {pipeline.index} of {dims.pp}: layers {a}..{b - 1}, 1F1B"
        )
        model, tp_plan = pipeline.layers, pipeline.local_names(tp_plan or {})
        names = pipeline.local_names(names)
    what = "stage" if pipeline else "model"
    sp_style = tp_style if sp and dims.tp_enabled else None
    if dims.tp_enabled:  # 2. tp: layers become shards before anything records the parameters
        tp = mesh["tp"] if tp_style == "dtensor" else axis_group(mesh, "tp")
        ranks = dist.get_process_group_ranks(axis_group(mesh, "tp"))
        if sp:  # the blocks' plan is sequence parallelism's own (Korthikanti et al. 2022)
            apply_sp(model, tp, tp_style)
            chain.append(
                f'apply_sp({what}, mesh["tp"], style="{tp_style}")  '
                f"# blocks tensor- and sequence-parallel over ranks {ranks}"
            )
        else:
            apply_tp(model, tp_plan, tp, tp_style)
            chain.append(
                f'apply_tp({what}, plan, mesh["tp"], style="{tp_style}")  '
                f"# {len(tp_plan)} linear layers split over ranks {ranks}"
            )
    if names:  # 3. ac: recompute the blocks' activations (their tp layers included)
        apply_ac(model, names)
        chain.append(f"apply_ac({what}, {sorted(names, key=lambda n: (len(n), n))})")
    module, zero, flavour = model, None, dp if dims.dp_enabled else None
    if flavour is not None:  # 4. dp: outermost, over the parameters as they now are
        ranks = _ranks(axis_group(mesh, "dp"))
        if flavour == "ddp":
            module = apply_ddp(model, mesh["dp"], bucket_cap_mb)
            chain.append(f'{what} = apply_ddp({what}, mesh["dp"])  # replicas on ranks {ranks}')
        elif flavour == "fsdp":
            module = apply_fsdp(model, mesh["dp"])
            chain.append(f'apply_fsdp({what}, mesh["dp"])  # FSDP2 shards over ranks {ranks}')
        else:
            zero = apply_zero(model, int(flavour[-1]), mesh["dp"], **kwargs)
            chain.append(
                f'zero = apply_zero({what}, stage={flavour[-1]}, dp=mesh["dp"])  '
                f"# shards over ranks {ranks}"
            )
    if pipeline is not None:
        pipeline.module = module
    pieces = _pieces(model, zero, pipeline)
    return Parallelized(dims, mesh, module, model, pieces, chain, zero, pipeline, kwargs, sp_style)


def _pieces(model: nn.Module, zero: ZeroBase | None, pipeline: PipelineStage | None) -> list:
    """The ``Piece`` objects the optimizer updates: ZeRO's shards, or the model's parameters."""
    if zero is not None:
        return [
            Piece(f"{u.name}.{n}" if u.name else n, shard, {"dp": 0})
            for u, shards in _unit_shards(zero)
            for n, shard in zip(u.names, shards, strict=True)
        ]
    split = tp_split(model)
    return [
        Piece(
            pipeline.global_name(n) if pipeline else n,
            p,
            {"tp": split[id(p)]} if id(p) in split else {},
        )
        for n, p in model.named_parameters()
    ]


def _unit_shards(zero: ZeroBase) -> list[tuple[Any, list[torch.Tensor]]]:
    out, i = [], 0
    for u in zero.units:
        out.append((u, zero.shards[i : i + len(u.params)]))
        i += len(u.params)
    return out
