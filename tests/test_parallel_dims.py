"""The dp × pp × tp rank grid (labkit.parallel.dims): arithmetic only, no processes."""

from __future__ import annotations

import itertools

import pytest

from labkit.parallel.dims import AXES, ParallelDims

# Every grid of 1, 2, 3, 4, 6 and 8 ranks, 1s included.
GRIDS = [
    (dp, pp, tp)
    for n in (1, 2, 3, 4, 6, 8)
    for dp, pp, tp in itertools.product(range(1, n + 1), repeat=3)
    if dp * pp * tp == n
]


def test_the_grids_cover_the_cases():
    assert (1, 1, 1) in GRIDS and (2, 2, 2) in GRIDS and (1, 8, 1) in GRIDS
    assert len([g for g in GRIDS if g[0] * g[1] * g[2] == 8]) == 10  # ordered factorizations


@pytest.mark.parametrize(("dp", "pp", "tp"), GRIDS)
def test_round_trip_rank_coordinates_rank(dp, pp, tp):
    d = ParallelDims(dp, pp, tp)
    assert d.world_size == dp * pp * tp
    seen = set()
    for r in range(d.world_size):
        c = d.coordinates(r)
        assert all(0 <= c[a] < d.degree(a) for a in AXES)
        assert c == {"dp": r // (pp * tp), "pp": r // tp % pp, "tp": r % tp}  # tp innermost
        assert d.rank(**c) == r
        seen.add(tuple(c.values()))
    assert len(seen) == d.world_size  # every coordinate triple exactly once


@pytest.mark.parametrize(("dp", "pp", "tp"), GRIDS)
def test_each_axis_groups_partition_the_ranks(dp, pp, tp):
    d = ParallelDims(dp, pp, tp)
    for axis in AXES:
        groups = d.groups(axis)
        assert len(groups) == d.world_size // d.degree(axis)
        assert all(len(g) == d.degree(axis) for g in groups)
        assert sorted(r for g in groups for r in g) == list(range(d.world_size))
        assert [g[0] for g in groups] == sorted(g[0] for g in groups)
        for g in groups:
            coords = [d.coordinates(r) for r in g]
            assert [c[axis] for c in coords] == list(range(d.degree(axis)))
            for other in AXES:
                if other != axis:
                    assert len({c[other] for c in coords}) == 1  # only `axis` differs
            assert all(d.group_of(r, axis) == g for r in g)
            assert all(b - a == d.stride(axis) for a, b in itertools.pairwise(g))


def test_eight_ranks_by_hand():
    d = ParallelDims(dp=2, pp=2, tp=2)
    assert d.groups("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]  # consecutive: NVLink peers
    assert d.groups("pp") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert d.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert d.group_of(5, "dp") == [1, 5] and d.group_of(5, "pp") == [5, 7]
    assert d.coordinates(5) == {"dp": 1, "pp": 0, "tp": 1}
    assert d.rank(dp=1, pp=1, tp=0) == 6
    assert [d.stride(a) for a in AXES] == [4, 2, 1]
    assert d.group_ranks("tp") == d.groups("tp")  # the name notebook 18 uses
    e = ParallelDims(dp=2, pp=1, tp=4)
    assert e.groups("tp") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert e.groups("pp") == [[r] for r in range(8)]  # degree 1: every rank alone
    assert e.groups("dp") == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_enabled_label_and_mesh_axes():
    d = ParallelDims(dp=2, pp=1, tp=2)
    assert (d.dp_enabled, d.pp_enabled, d.tp_enabled) == (True, False, True)
    assert d.label == "dp2·pp1·tp2"
    assert d.mesh_axes == ("dp", "tp") and d.mesh_shape == (2, 2)
    one = ParallelDims(1)
    assert not (one.dp_enabled or one.pp_enabled or one.tp_enabled)
    assert one.mesh_axes == ("dp",) and one.mesh_shape == (1,) and one.label == "dp1·pp1·tp1"


def test_nodes_spanned_counts_the_nodes_of_the_widest_group():
    d = ParallelDims(dp=2, pp=1, tp=8)  # 16 ranks, 8 per node
    assert d.nodes_spanned("tp", 8) == 1 and d.nodes_spanned("dp", 8) == 2
    assert d.nodes_spanned("pp", 8) == 1  # degree 1: a group is one rank
    assert ParallelDims(dp=1, tp=16).nodes_spanned("tp", 8) == 2
    # tp=3 on nodes of 4: groups [0,1,2] fit, [3,4,5] straddles two nodes
    assert ParallelDims(dp=4, tp=3).nodes_spanned("tp", 4) == 2
    assert ParallelDims(dp=4, tp=3).nodes_spanned("tp", 12) == 1
    with pytest.raises(ValueError, match="per_node must be an int >= 1"):
        d.nodes_spanned("tp", 0)


def test_degrees_are_validated_naming_the_bad_one():
    for kwargs, name in (
        ({"dp": 0}, "dp"),
        ({"dp": 2, "pp": -1}, "pp"),
        ({"dp": 1, "tp": 1.5}, "tp"),
        ({"dp": True}, "dp"),
        ({"dp": 2, "world_size": 0}, "world_size"),
    ):
        with pytest.raises(ValueError, match=rf"^{name} must be an int >= 1"):
            ParallelDims(**kwargs)
    with pytest.raises(ValueError, match=r"dp\(2\) \* pp\(2\) \* tp\(2\) = 8 != world_size\(4\)"):
        ParallelDims(dp=2, pp=2, tp=2, world_size=4)
    with pytest.raises(ValueError, match="dp=2, pp=1, tp=2"):  # a factorization that fits
        ParallelDims(dp=3, world_size=4)


def test_ranks_coordinates_and_axes_out_of_range():
    d = ParallelDims(dp=2, pp=2, tp=2)
    for bad in (-1, 8, 2.0, True):
        with pytest.raises(ValueError, match=r"outside the dp2·pp2·tp2 grid: not in 0..7"):
            d.coordinates(bad)
    with pytest.raises(ValueError, match=r"^pp coordinate 2 is not in 0..1"):
        d.rank(dp=0, pp=2, tp=0)
    with pytest.raises(ValueError, match=r"^tp coordinate -1 is not in 0..1"):
        d.rank(tp=-1)
    for call in (lambda: d.degree("ep"), lambda: d.groups("cp"), lambda: d.stride("x")):
        with pytest.raises(ValueError, match="unknown axis"):
            call()
    with pytest.raises(ValueError, match="outside"):
        d.group_of(9, "tp")


def test_the_mesh_and_the_capstone_share_this_class():
    import labkit.mesh
    from labkit.capstone import Strategy

    assert labkit.mesh.ParallelDims is ParallelDims
    s = Strategy(dp=2, pp=2, microbatches=2)
    assert s.dims == ParallelDims(2, 2, 1) and s.label.startswith(s.dims.label)
    assert [s.coords(r) for r in range(4)] == [
        tuple(s.dims.coordinates(r).values()) for r in range(4)
    ]
