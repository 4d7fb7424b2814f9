"""Device meshes: parallel degrees in one validated dataclass, their groups, hybrid training.

Introduced in notebooks/14_hybrid_parallel.ipynb.

``ParallelDims(dp, pp, tp)`` (``labkit.parallel.dims``, re-exported here) names how the
ranks are shared among data, pipeline and tensor parallelism and lays them out: a row-major
grid dp × pp × tp, tp innermost, so a tensor-parallel group is consecutive ranks (in one
node, on the fastest links) and a data-parallel group strides over the others, as
``torch.distributed.device_mesh.init_device_mesh`` lays out a mesh of that shape
(``build_mesh``).

Two hybrids, composed from the single techniques of notebooks 06, 11 and 12, each acting on
the group of its own axis:

- DP×TP (``train_dp_tp``): Megatron's column/row-parallel layers inside each tp group
  (``apply_tensor_parallel``), gradients averaged across the dp group in buckets
  (``DataParallelBucketed``, one all-reduce per bucket);
- DP×PP (``train_dp_pp``): each pp group runs the 1F1B schedule over labkit's pipeline
  runtime on its share of the batch, then the dp group averages the stages' gradients.

Both train to the same parameters as one process on the whole batch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.ddp.bucketed import DataParallelBucketed
from labkit.parallel.dims import AXES, ParallelDims
from labkit.parallel.pipeline import one_f_one_b
from labkit.parallel.pipeline.runtime import run_schedule
from labkit.parallel.pipeline.split import output_shapes, split_sequential
from labkit.parallel.tensor import apply_tensor_parallel
from labkit.trace import sync_device

__all__ = [
    "AXES",
    "ParallelDims",
    "axis_group",
    "axis_rank",
    "build_mesh",
    "coordinates",
    "dp_shard",
    "train_dp_pp",
    "train_dp_tp",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def build_mesh(dims: ParallelDims, device_type: str = "cpu") -> Any:
    """``init_device_mesh`` over the axes of degree > 1, named ``"dp"``, ``"pp"``, ``"tp"``.

    Introduced in notebooks/14_hybrid_parallel.ipynb. Call it on every rank, inside an
    initialised default group (``lk.launch`` provides one).

    Args:
        dims: the degrees; ``dims.world_size`` must be the default group's size.
        device_type: ``"cpu"`` or ``"cuda"``.

    Returns:
        torch.distributed.device_mesh.DeviceMesh: shape ``dims.mesh_shape``, names
        ``dims.mesh_axes``.

    Raises:
        ValueError: the default group's size is not ``dims.world_size``.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if dist.get_world_size() != dims.world_size:
        raise ValueError(
            f"{dims} needs {dims.world_size} ranks, but {dist.get_world_size()} are running"
        )
    return init_device_mesh(device_type, dims.mesh_shape, mesh_dim_names=dims.mesh_axes)


def axis_group(mesh: Any, axis: str) -> dist.ProcessGroup:
    """The process group of this rank along ``axis`` of ``mesh``.

    Introduced in notebooks/14_hybrid_parallel.ipynb.

    Args:
        mesh: from ``build_mesh``.
        axis: one of ``mesh.mesh_dim_names``.

    Returns:
        The ProcessGroup of the ranks that share every other coordinate with this one.

    Raises:
        ValueError: ``axis`` is not in the mesh (its degree is 1: nothing to communicate).
    """
    if axis not in (mesh.mesh_dim_names or ()):
        raise ValueError(
            f"the mesh has axes {mesh.mesh_dim_names}; {axis!r} has degree 1 and no group"
        )
    return mesh[axis].get_group()


def axis_rank(mesh: Any, axis: str) -> int:
    """This rank's coordinate along ``axis`` (0 for an axis of degree 1, absent from the mesh).

    Introduced in notebooks/14_hybrid_parallel.ipynb.
    """
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; axes: {AXES}")
    return mesh.get_local_rank(axis) if axis in (mesh.mesh_dim_names or ()) else 0


def coordinates(mesh: Any) -> dict[str, int]:
    """This rank's ``{"dp", "pp", "tp"}`` coordinates in ``mesh``.

    Introduced in notebooks/14_hybrid_parallel.ipynb.
    """
    return {a: axis_rank(mesh, a) for a in AXES}


def dp_shard(t: torch.Tensor, dims: ParallelDims, mesh: Any) -> torch.Tensor:
    """This rank's contiguous share of the global batch ``t`` along its dp coordinate.

    Introduced in notebooks/14_hybrid_parallel.ipynb.

    Raises:
        ValueError: the batch is not divisible by dp (unequal shares would bias the mean).
    """
    if t.shape[0] % dims.dp:
        raise ValueError(f"batch {t.shape[0]} is not divisible by dp={dims.dp}")
    n = t.shape[0] // dims.dp
    r = axis_rank(mesh, "dp")
    return t[r * n : (r + 1) * n]


def _average_gradients(params: list[nn.Parameter], group: dist.ProcessGroup) -> None:
    """Average ``params``' gradients over ``group`` with one all-reduce of them all, flattened."""
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat /= dist.get_world_size(group)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def _sgd(params: list[nn.Parameter], lr: float) -> None:
    with torch.no_grad():
        for p in params:
            if p.grad is not None:
                p.add_(p.grad, alpha=-lr)
                p.grad = None


def train_dp_tp(
    model: nn.Module,
    tp_plan: dict[str, str],
    dims: ParallelDims,
    mesh: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    steps: int,
    lr: float,
    bucket_cap_mb: float = 25.0,
    step_times: list[float] | None = None,
) -> tuple[nn.Module, list[float]]:
    """Train ``model`` with tensor parallelism in each tp group and data parallelism across.

    Introduced in notebooks/14_hybrid_parallel.ipynb (Narayanan et al. 2021, §2.3 and §3).
    Every rank starts from the same ``model`` (same seed). Its layers named in ``tp_plan``
    become Megatron shards over the tp group (``apply_tensor_parallel``); the result is wrapped
    in ``DataParallelBucketed`` over the dp group, which averages the gradients in buckets
    while backward runs (one all-reduce per bucket).
    Each step: this dp rank's share of ``(x, y)``, forward, backward, plain SGD.

    Args:
        model: the unsplit model (modified in place).
        tp_plan: as ``apply_tensor_parallel`` (e.g. ``{"0.fc1": "colwise", "0.fc2": "rowwise"}``).
        dims: the degrees (pp must be 1).
        mesh: from ``build_mesh(dims)``.
        x, y: the global batch, the same on every rank.
        loss_fn: mean over the batch.
        steps: optimizer steps.
        lr: SGD learning rate.
        bucket_cap_mb: the dp buckets' size cap in MiB (as torch DDP's argument).
        step_times: if given, each step's wall time on this rank (seconds) is appended.

    Returns:
        (the tensor-parallel model, unwrapped, whose parameters are this rank's shards; the
        loss of each step on this rank's share of the batch).

    Raises:
        ValueError: pp > 1, or the batch is not divisible by dp.
    """
    if dims.pp != 1:
        raise ValueError(f"train_dp_tp needs pp=1, got {dims}")
    if dims.tp > 1:
        apply_tensor_parallel(model, tp_plan, axis_group(mesh, "tp"))
    replica = model
    if dims.dp > 1:
        replica = DataParallelBucketed(model, axis_group(mesh, "dp"), bucket_cap_mb=bucket_cap_mb)
    xs, ys = dp_shard(x, dims, mesh), dp_shard(y, dims, mesh)
    params = [p for p in model.parameters() if p.requires_grad]
    losses = []
    for _ in range(steps):
        sync_device(xs.device)  # step times on a GPU cover the kernels, not their queueing
        start = time.perf_counter()
        loss = loss_fn(replica(xs), ys)
        loss.backward()  # the buckets are averaged over dp when it returns
        _sgd(params, lr)
        losses.append(float(loss.detach()))
        if step_times is not None:
            sync_device(xs.device)
            step_times.append(time.perf_counter() - start)
    return model, losses


def train_dp_pp(
    model: nn.Sequential,
    dims: ParallelDims,
    mesh: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: LossFn,
    steps: int,
    lr: float,
    n_microbatches: int,
    step_times: list[float] | None = None,
) -> tuple[nn.Module, list[float | None]]:
    """Train ``model`` with a 1F1B pipeline in each pp group and data parallelism across.

    Introduced in notebooks/14_hybrid_parallel.ipynb (Narayanan et al. 2021, §2.2 and §3).
    ``model`` is cut into ``pp`` stages (``split_sequential``); this rank keeps stage
    ``pp_rank``. Each step, the pp group runs ``one_f_one_b(pp, m)`` over
    ``run_schedule`` on this dp rank's share of the batch (gradients accumulate over the m
    micro-batches), then each stage's gradients are averaged over the dp group — one
    all-reduce of all of them, flattened, once per step — and SGD updates the stage.

    Args:
        model: an ``nn.Sequential`` with at least ``pp`` layers, the same on every rank.
        dims: the degrees (tp must be 1).
        mesh: from ``build_mesh(dims)``.
        x, y: the global batch, the same on every rank.
        loss_fn: mean over the micro-batch.
        steps: optimizer steps.
        lr: SGD learning rate.
        n_microbatches: m, micro-batches per step (must divide the dp share of the batch).
        step_times: if given, each step's wall time on this rank (seconds) is appended.

    Returns:
        (this rank's stage, whose layers are ``model``'s own objects; each step's loss on
        the last stage's ranks, None elsewhere).

    Raises:
        ValueError: tp > 1, or a batch that dp·m does not divide.
    """
    if dims.tp != 1:
        raise ValueError(f"train_dp_pp needs tp=1, got {dims}")
    xs, ys = dp_shard(x, dims, mesh), dp_shard(y, dims, mesh)
    if xs.shape[0] % n_microbatches:
        raise ValueError(f"dp share {xs.shape[0]} is not divisible by {n_microbatches=}")
    stages = split_sequential(model, dims.pp)
    pp_rank = axis_rank(mesh, "pp")
    inputs, targets = list(xs.chunk(n_microbatches)), list(ys.chunk(n_microbatches))
    shapes = output_shapes(stages, inputs[0])
    schedule = one_f_one_b(dims.pp, n_microbatches)
    pp_group = axis_group(mesh, "pp") if dims.pp > 1 else None
    dp_group = axis_group(mesh, "dp") if dims.dp > 1 else None
    params = [p for p in stages[pp_rank].parameters() if p.requires_grad]
    losses: list[float | None] = []
    for _ in range(steps):
        sync_device(xs.device)
        start = time.perf_counter()
        if pp_group is None:  # one stage: the pipeline is plain accumulation
            total = 0.0
            for a, b in zip(inputs, targets, strict=True):
                loss = loss_fn(stages[0](a), b) / n_microbatches
                loss.backward()
                total += float(loss.detach())
            losses.append(total)
        else:
            res = run_schedule(
                schedule, {pp_rank: stages[pp_rank]}, inputs, targets, loss_fn, shapes, pp_group
            )
            losses.append(res.loss)
        if dp_group is not None:
            _average_gradients(params, dp_group)
        _sgd(params, lr)
        if step_times is not None:
            sync_device(xs.device)
            step_times.append(time.perf_counter() - start)
    return stages[pp_rank], losses
