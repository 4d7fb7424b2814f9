"""Cases for tests/test_backends_shm.py beyond the collectives: send/recv around a ring (up to
1.6 MB, more than any mailbox), tags received out of order, receives from any source, async
Work, non-contiguous tensors, batch_isend_irecv and barrier, on the labkit_shm world and on
a group with 4 KiB mailboxes. ``run_specials`` runs on every rank and returns
``{case name: error text or None}``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tests.shm_cases import Case, make_input, mismatch, reference_reduce, tiny_group

P2P_SIZES = (0, 7, 1023, 70_000, 400_000)  # float32: up to 1.6 MB, more than any mailbox


def _check(results: dict, name: str, fn) -> None:
    try:
        results[name] = fn()
    except Exception as exc:  # noqa: BLE001 - reported per case
        results[name] = f"raised {type(exc).__name__}: {exc}"


def _ring(rank: int, n: int, g, numel: int) -> str | None:
    case = Case("ring", torch.float32, numel)
    right, left = (rank + 1) % n, (rank - 1) % n
    work = dist.isend(make_input(case, rank), right, group=g)  # must not wait for the receiver
    got = torch.empty(numel)
    dist.recv(got, left, group=g)
    work.wait()
    return mismatch(got, make_input(case, left), f"recv from rank {left}")


def _tags(rank: int, g) -> str | None:
    """Rank 0 sends tags 5 then 9; rank 1 receives 9 first: tag 5 must wait aside."""
    a, b = torch.arange(3.0), torch.arange(5.0) + 10
    if rank == 0:
        works = [dist.isend(a, 1, group=g, tag=5), dist.isend(b, 1, group=g, tag=9)]
        for w in works:
            w.wait()
        return None
    if rank == 1:
        got_b, got_a = torch.empty(5), torch.empty(3)
        dist.recv(got_b, 0, group=g, tag=9)
        dist.recv(got_a, 0, group=g, tag=5)
        return mismatch(got_a, a, "tag 5") or mismatch(got_b, b, "tag 9")
    return None


def _any_source(rank: int, n: int, g) -> str | None:
    case = Case("any", torch.int64, 11)
    if rank != 0:
        dist.send(make_input(case, rank), 0, group=g)
        return None
    seen = []
    for _ in range(n - 1):
        got = torch.empty(11, dtype=torch.int64)
        src = dist.recv(got, group=g)
        seen.append(src)
        err = mismatch(got, make_input(case, src), f"message from rank {src}")
        if err:
            return err
    return None if sorted(seen) == list(range(1, n)) else f"sources {seen}"


def _async(rank: int, n: int, g) -> str | None:
    case = Case("async", torch.float32, 1000, "sum")
    t = make_input(case, rank)
    work = dist.all_reduce(t, async_op=True, group=g)
    work.wait()
    if not work.is_completed():
        return "work not completed after wait()"
    value = work.get_future().value()
    want = reference_reduce("sum", [make_input(case, r) for r in range(n)])
    return mismatch(t, want, "tensor") or mismatch(value[0], want, "future value")


def _async_p2p(rank: int, n: int, g) -> str | None:
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.empty(5)
    recv = dist.irecv(got, left, group=g)
    send = dist.isend(torch.full((5,), float(rank)), right, group=g)
    recv.wait()
    send.wait()
    return mismatch(got, torch.full((5,), float(left)), "irecv")


def _noncontiguous(rank: int, n: int, g) -> str | None:
    case = Case("noncontig", torch.float64, 120, "sum")
    base = make_input(case, rank).view(12, 10)
    t = base.t()  # a transposed view: not contiguous
    dist.all_reduce(t, group=g)
    want = reference_reduce("sum", [make_input(case, r).view(12, 10) for r in range(n)])
    err = mismatch(base, want, "all_reduce into a transposed view")
    outs = [torch.zeros(7, 2)[:, 1] for _ in range(n)]  # strided outputs
    dist.all_gather(outs, torch.full((7,), float(rank)), group=g)
    for r, o in enumerate(outs):
        err = err or mismatch(o, torch.full((7,), float(r)), f"all_gather output {r}")
    right, left = (rank + 1) % n, (rank - 1) % n
    work = dist.isend(torch.arange(12.0).view(3, 4).t() + rank, right, group=g)
    got = torch.zeros(4, 6)[:, ::2]
    dist.recv(got, left, group=g)
    work.wait()
    return err or mismatch(got, torch.arange(12.0).view(3, 4).t() + left, "strided recv")


def _batch(rank: int, n: int, g) -> str | None:
    right, left = (rank + 1) % n, (rank - 1) % n
    got = torch.empty(3)
    ops = [
        dist.P2POp(dist.isend, torch.full((3,), float(rank)), right, g),
        dist.P2POp(dist.irecv, got, left, g),
    ]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return mismatch(got, torch.full((3,), float(left)), "batch_isend_irecv")


def run_specials(rank: int, world_size: int) -> dict[str, str | None]:
    """Send/recv, tags, any-source, async Work, non-contiguous tensors, barrier."""
    n = world_size
    results: dict[str, str | None] = {}
    for gname, g in (("shm", dist.group.WORLD), ("shm-tiny", tiny_group())):
        for numel in P2P_SIZES:
            _check(results, f"ring-{numel}-{gname}", lambda g=g, m=numel: _ring(rank, n, g, m))
        _check(results, f"tags-{gname}", lambda g=g: _tags(rank, g))
        _check(results, f"any_source-{gname}", lambda g=g: _any_source(rank, n, g))
        _check(results, f"async-{gname}", lambda g=g: _async(rank, n, g))
        _check(results, f"async_p2p-{gname}", lambda g=g: _async_p2p(rank, n, g))
        _check(results, f"noncontiguous-{gname}", lambda g=g: _noncontiguous(rank, n, g))
        _check(results, f"batch_isend_irecv-{gname}", lambda g=g: _batch(rank, n, g))
        _check(results, f"barrier-{gname}", lambda g=g: dist.barrier(group=g))
    return results
