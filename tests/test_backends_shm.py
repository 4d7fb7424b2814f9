"""labkit_shm computes what gloo computes: every collective × dtype × size on 2, 3 and 4 ranks
(8 once, marked slow), plus send/recv, tags, any-source receives, async Work, non-contiguous
tensors and the backend's registration.

One launch per world size runs every case (see ``tests/shm_cases.py``) on the labkit_shm world,
on a labkit_shm group with 4 KiB slots (so tensors stream through many chunks and reductions
take the reduce-scatter + all-gather path) and on a gloo subgroup, comparing on every rank
with gloo's result and with a single-process reference: integers exactly, floats within
``shm_cases.TOL``. The tests below read those results, one test per world size and kind.
"""

from __future__ import annotations

import functools
import os
from collections import defaultdict

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.backends._shm import segment
from tests import shm_cases, shm_p2p_cases
from tests.shm_cases import all_cases

WORLD_SIZES = [2, 3, 4, pytest.param(8, marks=pytest.mark.slow)]
KINDS = sorted({c.kind for c in all_cases(2)})
SPECIALS = (
    "ring",
    "tags",
    "any_source",
    "async",
    "async_p2p",
    "noncontiguous",
    "batch_isend_irecv",
    "barrier",
)


@pytest.fixture(scope="module", autouse=True)
def no_leaked_segments():
    before = {f for f in os.listdir(segment.SHM_DIR) if f.startswith(segment.PREFIX)}
    yield
    after = {f for f in os.listdir(segment.SHM_DIR) if f.startswith(segment.PREFIX)}
    assert after - before == set(), "a labkit_shm segment was left in /dev/shm"


@functools.cache
def _results(world_size: int) -> list[dict[str, str | None]]:
    return lk.launch(shm_cases.run_cases, world_size=world_size, backend="labkit_shm", timeout=300)


@functools.cache
def _specials(world_size: int) -> list[dict[str, str | None]]:
    return lk.launch(
        shm_p2p_cases.run_specials, world_size=world_size, backend="labkit_shm", timeout=120
    )


def _failures(results, prefix: str) -> dict[str, dict[int, str]]:
    bad: dict[str, dict[int, str]] = defaultdict(dict)
    seen = 0
    for rank, per_case in enumerate(results):
        for name, err in per_case.items():
            if name.split("-")[0] != prefix:
                continue
            seen += 1
            if err:
                bad[name][rank] = err
    assert seen, f"no case of kind {prefix!r} ran"
    return dict(bad)


def _report(bad: dict[str, dict[int, str]]) -> str:
    lines = [f"{len(bad)} case(s) differ, e.g.:"]
    for name, per_rank in list(bad.items())[:8]:
        rank, err = next(iter(per_rank.items()))
        lines.append(f"  {name} (rank {rank}): {err[:300]}")
    return "\n".join(lines)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_collective_equals_gloo_and_reference(world_size, kind):
    bad = _failures(_results(world_size), kind)
    assert not bad, _report(bad)


@pytest.mark.parametrize("what", SPECIALS)
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_point_to_point_async_and_strided(world_size, what):
    bad = _failures(_specials(world_size), what)
    assert not bad, _report(bad)


def test_cases_cover_every_dtype_size_and_op():
    cases = all_cases(2)
    assert {c.dtype for c in cases} == set(shm_cases.DTYPES)
    assert {c.numel for c in cases} >= set(shm_cases.SIZES)
    reduced = {(c.dtype, c.op) for c in cases if c.kind == "all_reduce"}
    assert all((dt, op) in reduced for dt in shm_cases.DTYPES for op in shm_cases.ops_for(dt))


def test_the_reference_catches_a_wrong_result():
    """The comparison the cases rely on would fail on a wrong sum (the tests can fail)."""
    case = shm_cases.Case("all_reduce", torch.float32, 7, "sum")
    xs = [shm_cases.make_input(case, r) for r in range(3)]
    right = shm_cases.reference_reduce("sum", xs)
    assert shm_cases.mismatch(right.clone(), right, "sum") is None
    assert shm_cases.mismatch(right + 1e-3, right, "sum") is not None
    wrapped = shm_cases.reference_reduce("sum", [torch.full((1,), 100, dtype=torch.int8)] * 2)
    assert wrapped.item() == -56  # int8 sums wrap, as gloo's do


def test_import_registers_the_backend_once():
    import importlib

    import labkit.backends.shm as shm

    importlib.reload(shm)  # a second registration must be a no-op, not an error
    shm.register()
    assert "labkit_shm" in dist.Backend.backend_list
    assert dist.Backend._plugins["LABKIT_SHM"].creator_fn is not None
    assert dist.Backend.default_device_backend_map["cpu"] == "gloo"  # gloo stays the default


def _info(rank, world_size):
    g = dist.group.WORLD
    return dist.get_backend(), g.group_name, g.name(), type(g).__name__


def test_launch_by_name_gives_a_labkit_shm_world():
    for backend, group_name, name, cls in lk.launch(_info, world_size=2, backend="labkit_shm"):
        assert (backend, name, cls) == ("labkit_shm", "labkit_shm", "ShmProcessGroup")
        assert group_name  # init_device_mesh needs the name torch assigned


def _blocking_vs_polling(rank, world_size):
    pg = dist.group.WORLD
    x = torch.arange(600_000, dtype=torch.float32) * (rank + 1)  # 2.4 MB: several rounds
    blocking = x.clone()
    dist.all_reduce(blocking)
    pg._rounds._addr = None  # wait the way it does where futexes are missing
    polling = x.clone()
    dist.all_reduce(polling)
    dist.barrier()
    return blocking, polling


def test_waiting_with_futexes_or_by_polling_gives_the_same_bits():
    out = lk.launch(_blocking_vs_polling, world_size=3, backend="labkit_shm")
    want = torch.arange(600_000, dtype=torch.float32) * 6
    for blocking, polling in out:
        torch.testing.assert_close(blocking, want, rtol=0, atol=0)
        assert torch.equal(blocking, polling)
