"""Tests for labkit/backends/recording.py: results unchanged, every operation recorded right.

Every collective and p2p op runs on 3 ranks over gloo (and labkit_shm, when present) and over
``labkit_record`` wrapping it; the tensors must be bit-for-bit equal and each rank's records
must list exactly the ops it issued, with torch.distributed's names, nccl-tests' byte counts
and global ranks. DDP and FSDP2 must train to identical parameters, and a bucketed DDP step
must issue exactly one all_reduce per bucket (bucket assignment computed by torch's own
function).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.backends import recording

WORLD = 3
SUB = [0, 2]  # a subgroup's global ranks


def _rand(rank: int, n: int, salt: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 * salt + rank)
    return torch.randn(n, generator=g).to(dtype)


def _every_op(rank: int, world_size: int) -> dict:
    """Run every operation once; return the tensors they produced (and records, if any)."""
    out: dict = {}
    for i, op in enumerate(("SUM", "AVG", "MAX", "PRODUCT")):
        t = _rand(rank, 7, i)
        dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
        out[f"all_reduce_{op}"] = t
    t = torch.arange(5, dtype=torch.int64) * (rank + 1)
    dist.all_reduce(t)
    out["all_reduce_int64"] = t
    t = _rand(rank, 6, 10)
    dist.broadcast(t, src=1)
    out["broadcast"] = t
    t = _rand(rank, 6, 11)
    dist.reduce(t, dst=0)
    out["reduce"] = t if rank == 0 else None  # non-roots' buffers are scratch
    parts = [torch.empty(4) for _ in range(world_size)]
    dist.all_gather(parts, _rand(rank, 4, 12))
    out["all_gather"] = torch.cat(parts)
    whole = torch.empty(4 * world_size)
    dist.all_gather_into_tensor(whole, _rand(rank, 4, 13))
    out["all_gather_into_tensor"] = whole
    objs = [None] * world_size
    dist.all_gather_object(objs, {"rank": rank})
    out["all_gather_object"] = objs
    mine = torch.empty(3)
    dist.reduce_scatter(mine, list(_rand(rank, 3 * world_size, 14).chunk(world_size)))
    out["reduce_scatter"] = mine
    mine = torch.empty(2)
    dist.reduce_scatter_tensor(mine, _rand(rank, 2 * world_size, 15))
    out["reduce_scatter_tensor"] = mine
    got = [torch.empty(2) for _ in range(world_size)]
    dist.all_to_all(got, list(_rand(rank, 2 * world_size, 16).chunk(world_size)))
    out["all_to_all"] = torch.cat(got)
    got = torch.empty(3 * world_size)
    dist.all_to_all_single(got, _rand(rank, 3 * world_size, 17))
    out["all_to_all_single"] = got
    gathered = [torch.empty(2) for _ in range(world_size)] if rank == 0 else None
    dist.gather(_rand(rank, 2, 18), gathered, dst=0)
    out["gather"] = torch.cat(gathered) if rank == 0 else None
    t = torch.empty(2)
    dist.scatter(
        t, list(_rand(rank, 2 * world_size, 19).chunk(world_size)) if rank == 1 else None, src=1
    )
    out["scatter"] = t
    dist.barrier()
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    t = torch.empty(3)
    works = [dist.isend(_rand(rank, 3, 20), right), dist.irecv(t, left)]
    for w in works:
        w.wait()
    out["isend_irecv"] = t
    t = torch.empty(2)
    ops = [dist.P2POp(dist.isend, _rand(rank, 2, 21), left), dist.P2POp(dist.irecv, t, right)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch_isend_irecv"] = t
    t = torch.empty(4)
    if rank == 1:
        dist.send(_rand(rank, 4, 22), 0)
    elif rank == 0:
        out["recv_any_source"] = dist.recv(t)  # src=None: the source rank comes back
        out["recv_any"] = t
    ts = [_rand(rank, 3, 23), _rand(rank, 5, 24)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    out["coalesced"] = ts
    sub = dist.new_group(SUB)
    if rank in SUB:
        t = _rand(rank, 4, 25)
        dist.all_reduce(t, group=sub)
        out["subgroup"] = t
    if dist.get_backend().startswith("labkit_record"):
        out["records"] = recording.records()
    return out


def _expected_records(rank: int, world_size: int) -> list[tuple]:
    """(op, n_bytes, participants, peer, root) of every op ``_every_op`` issues on ``rank``."""
    everyone = tuple(range(world_size))
    f4 = 4  # bytes per float32
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    rows = [("all_reduce", 7 * f4, everyone, None, None)] * 4
    rows += [("all_reduce", 5 * 8, everyone, None, None)]
    rows += [("broadcast", 6 * f4, everyone, None, 1), ("reduce", 6 * f4, everyone, None, 0)]
    rows += [("all_gather", 4 * f4 * world_size, everyone, None, None)]
    rows += [("all_gather_into_tensor", 4 * f4 * world_size, everyone, None, None)]
    # all_gather_object: sizes (an all_gather of one int64 each), then the padded pickles
    rows += [
        ("all_gather", 8 * world_size, everyone, None, None),
        ("all_gather", None, everyone, None, None),
    ]
    rows += [("reduce_scatter", 3 * f4 * world_size, everyone, None, None)]
    rows += [("reduce_scatter_tensor", 2 * f4 * world_size, everyone, None, None)]
    rows += [("all_to_all", 2 * f4 * world_size, everyone, None, None)]
    rows += [("all_to_all_single", 3 * f4 * world_size, everyone, None, None)]
    rows += [("gather", 2 * f4 * world_size, everyone, None, 0)]
    rows += [("scatter", 2 * f4 * world_size, everyone, None, 1)]
    rows += [("barrier", 0, everyone, None, None)]
    rows += [
        ("send", 3 * f4, (rank, right), right, None),
        ("recv", 3 * f4, (left, rank), left, None),
    ]
    rows += [
        ("send", 2 * f4, (rank, left), left, None),
        ("recv", 2 * f4, (right, rank), right, None),
    ]
    if rank == 1:
        rows += [("send", 4 * f4, (1, 0), 0, None)]
    if rank == 0:
        rows += [("recv", 4 * f4, (1, 0), 1, None)]  # any source: learnt on completion
    rows += [("all_reduce_coalesced", 8 * f4, everyone, None, None)]
    if rank in SUB:
        rows += [("all_reduce", 4 * f4, tuple(SUB), None, None)]
    return rows


def _have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


INNERS = [
    "gloo",
    pytest.param(
        "labkit_shm",
        marks=pytest.mark.skipif(not _have("labkit.backends.shm"), reason="no labkit_shm yet"),
    ),
]


@pytest.fixture(scope="module", params=INNERS)
def runs(request) -> dict[str, list[dict]]:
    """Every op on the inner backend itself ("plain") and wrapped by the recording one."""
    inner = request.param
    return {
        "plain": lk.launch(_every_op, world_size=WORLD, backend=inner, timeout=60),
        "record": lk.launch(_every_op, world_size=WORLD, backend=recording.spec(inner), timeout=60),
    }


def test_every_result_is_bitwise_the_inner_backends(runs) -> None:
    for rank in range(WORLD):
        want, got = runs["plain"][rank], runs["record"][rank]
        assert set(got) - {"records"} == set(want), rank
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(got[key], value), (rank, key)
            elif isinstance(value, list) and value and isinstance(value[0], torch.Tensor):
                assert all(torch.equal(a, b) for a, b in zip(got[key], value, strict=True)), key
            else:
                assert got[key] == value, (rank, key)


def test_results_are_right_not_just_equal(runs) -> None:
    """Guard against a comparison of two equally broken runs: check a few by hand."""
    r0 = runs["record"][0]
    want = sum(_rand(r, 7, 0) for r in range(WORLD))
    torch.testing.assert_close(r0["all_reduce_SUM"], want, rtol=1e-6, atol=1e-6)
    assert r0["all_reduce_int64"].tolist() == [6 * i for i in range(5)]
    assert torch.equal(r0["broadcast"], _rand(1, 6, 10))
    assert r0["recv_any_source"] == 1 and torch.equal(r0["recv_any"], _rand(1, 4, 22))


@pytest.mark.parametrize("rank", range(WORLD))
def test_records_list_exactly_the_ops_issued(runs, rank: int) -> None:
    rows = runs["record"][rank]["records"]
    got = [(r.op, r.n_bytes, r.participants, r.peer, r.root) for r in rows]
    want = _expected_records(rank, WORLD)
    assert [g[0] for g in got] == [w[0] for w in want]
    for g, w in zip(got, want, strict=True):
        assert g[2:] == w[2:], (g, w)
        if w[1] is not None:  # the pickled objects' padded size is torch's business
            assert g[1] == w[1], (g, w)
    assert all(r.rank == rank for r in rows)
    assert [r.seq for r in rows] == sorted(r.seq for r in rows)
    dtypes = {r.op: r.dtype for r in rows}
    assert dtypes["barrier"] == "" and dtypes["broadcast"] == "float32"
    ops = [r.reduce_op for r in rows if r.op == "all_reduce"][:4]
    assert ops == ["SUM", "AVG", "MAX", "PRODUCT"]


def test_groups_are_named_and_told_apart(runs) -> None:
    for rank in range(WORLD):
        rows = runs["record"][rank]["records"]
        groups = {r.group for r in rows}
        assert "0" in groups  # torch names the default group "0"
        assert (len(groups) == 2) == (rank in SUB)


def test_times_are_ordered_and_plausible(runs) -> None:
    for rank in range(WORLD):
        rows = runs["record"][rank]["records"]
        assert all(r.end_ns is not None and r.start_ns <= r.end_ns for r in rows)
        starts = [r.start_ns for r in rows]
        assert starts == sorted(starts)  # issued one after another on one clock
        assert all(0 <= r.duration_s < 60 for r in rows)
        assert rows[-1].end_ns - rows[0].start_ns < 60e9


def test_clocks_agree_across_ranks(runs) -> None:
    """A barrier ends on every rank after the last rank entered it: only true if the ranks'
    clocks are one clock."""
    barriers = [
        [r for r in runs["record"][k]["records"] if r.op == "barrier"][0] for k in range(WORLD)
    ]
    last_entry = max(b.start_ns for b in barriers)
    assert all(b.end_ns >= last_entry for b in barriers)


def _ddp(rank: int, world_size: int, steps: int = 3) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    cap_bytes = 300  # w2+b2 (272 bytes) fill one bucket, w1+b1 (576) the next
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap_bytes / 2**20)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    per_step = []
    for step in range(steps):
        recorded = dist.get_backend().startswith("labkit_record")
        if recorded:
            recording.clear()
        torch.manual_seed(100 * step + rank)
        ddp(torch.randn(5, 8)).square().sum().backward()
        opt.step()
        opt.zero_grad()
        if recorded:
            per_step.append([(r.op, r.n_bytes) for r in recording.records()])
    # The buckets DDP builds after the first step, from the order gradients became ready
    # (last layer first), by torch's own assignment function.
    ready = list(reversed(list(model.parameters())))
    buckets, _ = dist._compute_bucket_assignment_by_size(ready, [cap_bytes], [False] * len(ready))
    sizes = [sum(ready[i].numel() * 4 for i in b) for b in buckets]
    params = [p.detach().clone() for p in model.parameters()]
    return {"params": params, "per_step": per_step, "bucket_bytes": sizes}


def test_ddp_trains_identically_and_sends_one_all_reduce_per_bucket() -> None:
    plain = lk.launch(_ddp, world_size=2, backend="gloo", timeout=60)
    recorded = lk.launch(_ddp, world_size=2, backend=recording.spec("gloo"), timeout=60)
    for rank in range(2):
        for a, b in zip(plain[rank]["params"], recorded[rank]["params"], strict=True):
            assert torch.equal(a, b)
        steps, buckets = recorded[rank]["per_step"], recorded[rank]["bucket_bytes"]
        assert len(buckets) == 2
        # Step 0 reduces every gradient as one bucket; then the buckets are rebuilt.
        assert steps[0] == [("all_reduce", sum(buckets))]
        for step in steps[1:]:
            reduces = [n for op, n in step if op == "all_reduce"]
            assert sorted(reduces) == sorted(buckets)
        assert [op for op, _ in steps[2]] == ["all_reduce"] * len(buckets)


def _fsdp(rank: int, world_size: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world_size,))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        torch.manual_seed(100 * step + rank)
        model(torch.randn(5, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    full = [p.full_tensor() for p in model.parameters()]
    ops = []
    if dist.get_backend().startswith("labkit_record"):
        ops = sorted({r.op for r in recording.records()})
    return {"params": full, "ops": ops}


def test_fsdp2_trains_identically_through_the_wrapper() -> None:
    plain = lk.launch(_fsdp, world_size=2, backend="gloo", timeout=60)
    recorded = lk.launch(_fsdp, world_size=2, backend=recording.spec("gloo"), timeout=60)
    for rank in range(2):
        for a, b in zip(plain[rank]["params"], recorded[rank]["params"], strict=True):
            assert torch.equal(a, b)
        assert {"all_gather_into_tensor", "reduce_scatter_tensor"} <= set(recorded[rank]["ops"])


def _plain_gloo(store, rank, size, timeout):
    """A creator returning a c10d Backend (not a ProcessGroup): the generic inner path."""
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def _sum_and_name(rank: int, world_size: int) -> tuple:
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    return t.tolist(), dist.get_backend(), [r.op for r in recording.records()]


def test_inner_can_be_any_backend_spec() -> None:
    inner = lk.BackendSpec("plain_gloo", creator=_plain_gloo)
    out = lk.launch(_sum_and_name, world_size=2, backend=recording.spec(inner), timeout=60)
    assert out[0] == ([1.0] * 3, "labkit_record_plain_gloo", ["all_reduce"])


def test_registered_by_name_with_the_inner_from_the_environment(monkeypatch) -> None:
    out = lk.launch(_sum_and_name, world_size=2, backend="labkit_record", timeout=60)
    assert out[1] == ([1.0] * 3, "labkit_record", ["all_reduce"])
    monkeypatch.setenv(recording.INNER_ENV, "no_such_backend")
    with pytest.raises(lk.RankError, match="no backend 'no_such_backend'"):
        lk.launch(_sum_and_name, world_size=2, backend="labkit_record", timeout=60)


def test_spec_names_and_checks_its_inner() -> None:
    assert recording.spec().name == "labkit_record_gloo"
    assert recording.spec("labkit_shm").name == "labkit_record_labkit_shm"
    assert recording.spec("nccl").devices == ("cuda",)
    with pytest.raises(ValueError, match="backend name or an lk.BackendSpec"):
        recording.spec(3)  # type: ignore[arg-type]


def test_summarize_counts_bytes_and_time() -> None:
    rows = [
        recording.OpRecord("all_reduce", 8, "float32", (0, 1), 0, 10, 0, "0"),
        recording.OpRecord("all_reduce", 4, "float32", (0, 1), 20, 50, 0, "0"),
        recording.OpRecord("broadcast", 4, "float32", (0, 1), 60, None, 0, "0"),
    ]
    got = recording.summarize(rows)
    assert list(got) == ["all_reduce", "broadcast"]
    assert got["all_reduce"] == {"count": 2, "n_bytes": 12, "time_s": pytest.approx(40e-9)}
    assert got["broadcast"] == {"count": 1, "n_bytes": 4, "time_s": 0.0}


def test_records_refuses_a_group_that_does_not_record() -> None:
    with pytest.raises(ValueError, match="does not record"):
        recording.records(dist.ProcessGroup(0, 1))
