"""Device meshes: the rank grid of ``ParallelDims`` as a ``DeviceMesh``, its groups, data shares.

Introduced in notebooks/18_hybrid_parallel.ipynb.

``ParallelDims(dp, pp, tp)`` (``labkit.parallel.dims``, re-exported here) names how the
ranks are shared among data, pipeline and tensor parallelism and lays them out: a row-major
grid dp × pp × tp, tp innermost, so a tensor-parallel group is consecutive ranks (in one
node, on the fastest links) and a data-parallel group strides over the others, as
``torch.distributed.device_mesh.init_device_mesh`` lays out a mesh of that shape
(``build_mesh``). Each technique then acts on the group of its own axis (``axis_group``);
``labkit.parallel.compose`` composes them on this mesh (DP×TP, DP×PP, FSDP2×TP, dp×tp×pp).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from labkit.parallel.dims import AXES, ParallelDims

__all__ = [
    "AXES",
    "ParallelDims",
    "axis_group",
    "axis_rank",
    "build_mesh",
    "coordinates",
    "dp_shard",
]


def build_mesh(dims: ParallelDims, device_type: str = "cpu") -> Any:
    """``init_device_mesh`` over the axes of degree > 1, named ``"dp"``, ``"pp"``, ``"tp"``.

    Call it on every rank, inside an initialised default group (``lk.launch`` provides one).

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

    Args:
        mesh: from ``build_mesh``.
        axis: ``"dp"``, ``"pp"`` or ``"tp"``.

    Returns:
        The coordinate.

    Raises:
        ValueError: an unknown axis.
    """
    if axis not in AXES:
        raise ValueError(f"unknown axis {axis!r}; axes: {AXES}")
    return mesh.get_local_rank(axis) if axis in (mesh.mesh_dim_names or ()) else 0


def coordinates(mesh: Any) -> dict[str, int]:
    """This rank's ``{"dp", "pp", "tp"}`` coordinates in ``mesh`` (``axis_rank`` of each)."""
    return {a: axis_rank(mesh, a) for a in AXES}


def dp_shard(t: torch.Tensor, dims: ParallelDims, mesh: Any) -> torch.Tensor:
    """This rank's contiguous share of the global batch ``t`` along its dp coordinate.

    Args:
        t: the global batch, the same on every rank (batch first).
        dims: the degrees.
        mesh: from ``build_mesh(dims)``.

    Returns:
        Rows ``[r·B/dp, (r+1)·B/dp)`` of ``t`` for dp coordinate r.

    Raises:
        ValueError: the batch is not divisible by dp (unequal shares would bias the mean).
    """
    if t.shape[0] % dims.dp:
        raise ValueError(f"batch {t.shape[0]} is not divisible by dp={dims.dp}")
    n = t.shape[0] // dims.dp
    r = axis_rank(mesh, "dp")
    return t[r * n : (r + 1) * n]
