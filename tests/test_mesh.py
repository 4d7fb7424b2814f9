"""Tests for labkit/mesh.py: degrees validated, groups as init_device_mesh lays them out.

The hybrids composed on these meshes (DP×TP, DP×PP, FSDP2×TP) are tested against one process in
tests/test_parallel_compose.py.
"""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.mesh import ParallelDims

# ParallelDims: pure arithmetic


def test_dims_validated_with_the_arithmetic():
    d = ParallelDims(dp=2, pp=1, tp=2, world_size=4)
    assert d.mesh_axes == ("dp", "tp") and d.mesh_shape == (2, 2)
    assert ParallelDims(dp=8).world_size == 8
    assert ParallelDims(1).mesh_axes == ("dp",) and ParallelDims(1).mesh_shape == (1,)
    with pytest.raises(ValueError, match=r"dp\(2\) \* pp\(2\) \* tp\(2\) = 8 != world_size\(4\)"):
        ParallelDims(dp=2, pp=2, tp=2, world_size=4)
    with pytest.raises(ValueError, match="dp=2, pp=1, tp=2"):  # suggests factorizations of 4
        ParallelDims(dp=3, world_size=4)
    for bad in ({"dp": 0}, {"dp": 2, "tp": -1}, {"dp": 1.5}, {"dp": True}):
        with pytest.raises(ValueError, match="must be an int >= 1"):
            ParallelDims(**bad)
    with pytest.raises(ValueError, match="unknown axis"):
        d.degree("ep")


def test_group_ranks_row_major_tp_innermost():
    d = ParallelDims(dp=2, pp=2, tp=2)
    assert d.group_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert d.group_ranks("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert d.group_ranks("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert d.coordinates(5) == {"dp": 1, "pp": 0, "tp": 1}
    with pytest.raises(ValueError, match="outside"):
        d.coordinates(8)


# On 4 ranks


def _groups_rank(rank, world_size, dp, pp, tp, world=4):
    import torch.distributed as dist

    dims = ParallelDims(dp, pp, tp, world_size=world)
    mesh = lk.mesh.build_mesh(dims)
    groups = {a: dist.get_process_group_ranks(lk.mesh.axis_group(mesh, a)) for a in dims.mesh_axes}
    try:
        lk.mesh.axis_group(mesh, "pp" if pp == 1 else "tp")
        missing = None
    except ValueError as exc:
        missing = str(exc)
    return groups, lk.mesh.coordinates(mesh), mesh.mesh.tolist(), missing


@pytest.mark.parametrize(("dp", "pp", "tp"), [(2, 1, 2), (2, 2, 1)])
def test_groups_match_init_device_mesh(dp, pp, tp):
    dims = ParallelDims(dp, pp, tp)
    out = lk.launch(_groups_rank, 4, "gloo", args=(dp, pp, tp), device="cpu", timeout=120)
    for rank, (groups, coords, layout, missing) in enumerate(out):
        assert coords == dims.coordinates(rank)
        for axis, ranks in groups.items():
            assert ranks in dims.group_ranks(axis) and rank in ranks
        assert layout == torch.arange(4).reshape(dims.mesh_shape).tolist()
        assert "has degree 1 and no group" in missing
    with pytest.raises(lk.RankError, match="needs 8 ranks"):
        lk.launch(_groups_rank, 4, "gloo", args=(2, 2, 2, None), device="cpu", timeout=60)
