"""Tests for labkit/bench_collectives.py (lk.bench.collective): rows, sizes, busbw, groups."""

from __future__ import annotations

import math

import pytest
import torch.distributed as dist

import labkit as lk
from labkit.bench import COLLECTIVES, collective, collective_sizes
from labkit.bench_collectives import _elements
from labkit.costmodel import busbw_factor

SIZES = [1, 64, 4096, 1000, 64]  # unsorted, a duplicate, one not divisible by 4·p


@pytest.fixture(scope="module")
def rows_by_rank() -> list[dict[str, list]]:
    def run(rank: int, world_size: int) -> dict[str, list]:
        return {name: collective(name, SIZES, iters=3, warmup=1) for name in COLLECTIVES}

    return lk.launch(run, world_size=3, device="cpu", timeout=90)


def test_every_rank_gets_the_same_rows(rows_by_rank) -> None:
    first = rows_by_rank[0]
    assert set(first) == set(COLLECTIVES)
    for other in rows_by_rank[1:]:
        assert other == first  # the slowest rank's samples, shared by one MAX all-reduce


@pytest.mark.parametrize("name", COLLECTIVES)
def test_row_fields_and_busbw(rows_by_rank, name) -> None:
    rows = rows_by_rank[0][name]
    want_sizes = sorted({4 * _elements(name, n, 3) for n in SIZES})
    assert [r.n_bytes for r in rows] == want_sizes
    for r in rows:
        assert r.op == name and r.world_size == 3 and r.backend == "gloo" and r.device == "cpu"
        assert r.iters == 3 and len(r.times_s) == 3 and r.time_s == sorted(r.times_s)[1]
        assert r.time_s > 0 and math.isfinite(r.time_s)
        assert math.isclose(r.algbw_gbps, r.n_bytes / r.time_s / 1e9, rel_tol=1e-12)
        factor = busbw_factor(name, 3)
        assert math.isclose(r.busbw_gbps, r.algbw_gbps * factor, rel_tol=1e-12)


def test_sizes_round_to_whole_elements_and_blocks() -> None:
    assert _elements("all_reduce", 1, 4) == 1  # at least one element
    assert _elements("all_reduce", 1000, 4) == 250
    assert _elements("broadcast", 1003, 4) == 250
    assert _elements("all_gather", 1, 4) == 4  # one element per rank at least
    assert _elements("reduce_scatter", 1000, 3) == 249  # 250 rounded down to 3 blocks
    assert _elements("all_to_all", 4096, 4) == 1024


def test_default_sizes() -> None:
    full, fast = collective_sizes(), collective_sizes(fast=True)
    assert full[0] == 8 and full[-1] == 32 << 20 and full == sorted(full)
    assert len(fast) < len(full) and fast == sorted(fast) and fast[-1] <= 1 << 20


def test_subgroup_and_non_members() -> None:
    def run(rank: int, world_size: int) -> tuple[list, list]:
        sub = dist.new_group([1, 2])  # every rank calls new_group, members or not
        in_sub = collective("broadcast", [16], iters=2, warmup=0, group=sub)
        reduced = collective("all_reduce", [16, 32], iters=2, warmup=0, group=sub)
        return [r.world_size for r in in_sub], [r.n_bytes for r in reduced]

    out = lk.launch(run, world_size=3, device="cpu", timeout=60)
    assert out == [([], []), ([2], [16, 32]), ([2], [16, 32])]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"name": "allreduce", "sizes_bytes": [8]},
        {"name": "all_reduce", "sizes_bytes": []},
        {"name": "all_reduce", "sizes_bytes": [0]},
        {"name": "all_reduce", "sizes_bytes": [8], "iters": 0},
        {"name": "all_reduce", "sizes_bytes": [8], "warmup": -1},
    ],
)
def test_bad_arguments_fail_before_communicating(kwargs) -> None:
    with pytest.raises(ValueError):
        collective(**kwargs)  # no process group needed: checked first


def test_format_table_prints_collective_rows(rows_by_rank) -> None:
    lines = lk.bench.format_table(rows_by_rank[0]["all_reduce"]).splitlines()
    assert "busbw (GB/s)" in lines[0] and lines[1].split()[0] == "all_reduce"


def test_labkit_bench_command(capsys) -> None:
    from labkit.cli import main

    code = main(
        [
            "bench",
            "--world-size",
            "2",
            "--collective",
            "reduce_scatter",
            "--sizes",
            "1K",
            "64K",
            "--iters",
            "2",
            "--warmup",
            "0",
            "--backend",
            "gloo",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "# reduce_scatter on 2 ranks, backend gloo, cpu"
    assert [line.split()[:2] for line in out[2:]] == [
        ["reduce_scatter", "1024"],
        ["reduce_scatter", "65536"],
    ]


def test_labkit_bench_sizes_and_errors(capsys) -> None:
    from labkit.cli import _size, main

    assert [_size(s) for s in ("8", "1K", "16M", "1g", "2KB", "0.5K")] == [
        8,
        1024,
        16 << 20,
        1 << 30,
        2048,
        512,
    ]
    assert main(["bench", "--collective", "allreduce"]) == 2
    assert "unknown collective 'allreduce'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--sizes", "lots"])
