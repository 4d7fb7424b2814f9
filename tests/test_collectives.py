"""labkit.collectives: every all-reduce built from send/recv equals dist.all_reduce, and the
messages and bytes each rank sends equal the formulas of Thakur, Rabenseifner and Gropp 2005.

One launch per world size runs every case (algorithm × op × dtype × size) on every rank;
the ranks compare with ``dist.all_reduce`` themselves and return compact rows (an error text
or None, a hash of the result, the counted traffic), which the tests below read.
"""

from __future__ import annotations

import functools
import hashlib
import math
import zlib

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.collectives import (
    ALGORITHMS,
    chunk_bounds,
    chunk_sizes,
    expected_bytes,
    expected_messages,
    op_name,
    tree_children,
)

ALGS = tuple(ALGORITHMS)
OPS = ("sum", "product", "min", "max", "avg")
DTYPES = (torch.float32, torch.float64, torch.int64)
SIZES = (0, 1, 3, 7, 1000, 1023)  # empty, smaller than p, not divisible by p
WORLD_SIZES = (1, 2, 3, 4, 5)
REDOP = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}
# (rtol, atol): sums of up to 5 values in another order; bf16 keeps 8 significant bits.
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-12, 1e-12),
    torch.bfloat16: (2e-2, 1e-1),
    torch.int64: (0, 0),
}
SENTINEL = 77  # guard values around the tensor: an algorithm must not write outside it


def _cases() -> list[tuple[str, str, torch.dtype, int]]:
    combos = [
        (op, dt) for op in OPS for dt in DTYPES if not (op == "avg" and not dt.is_floating_point)
    ]
    combos.append(("sum", torch.bfloat16))
    return [(alg, op, dt, n) for alg in ALGS for op, dt in combos for n in SIZES]


def _input(rank: int, op: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
    seed = zlib.crc32(repr((rank, op, str(dtype), numel)).encode())  # stable across runs
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.int64:
        lo, hi = (-3, 4) if op == "product" else (-1000, 1000)  # products wrap exactly anyway
        return torch.randint(lo, hi, (numel,), generator=gen)
    if op == "product":  # magnitudes near 1: no overflow or underflow over 5 ranks
        x = torch.rand(numel, generator=gen, dtype=torch.float64) + 0.5
        x = x * torch.where(torch.rand(numel, generator=gen) < 0.5, -1.0, 1.0).double()
    else:
        x = torch.randn(numel, generator=gen, dtype=torch.float64)
    return x.to(dtype)


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _close(got: torch.Tensor, want: torch.Tensor) -> str | None:
    rtol, atol = TOL[want.dtype]
    try:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
    except AssertionError as exc:
        return str(exc).splitlines()[0]
    return None


def _run_case(rank, alg, op, dtype, numel, group=None) -> dict:
    x = _input(rank, op, dtype, numel)
    want = x.clone()
    dist.all_reduce(want, op=REDOP[op], group=group)
    guarded = torch.full((numel + 2,), SENTINEL, dtype=dtype)
    t = guarded[1:-1]
    t.copy_(x)
    with lk.collectives.count_messages() as stats:
        returned = ALGORITHMS[alg](t, op=REDOP[op], group=group)
    error = _close(t, want)
    if returned is not None:
        error = f"returned {type(returned).__name__}, expected None (in place)"
    if not (guarded[0] == SENTINEL and guarded[-1] == SENTINEL):
        error = "wrote outside the tensor it was given"
    if not torch.equal(x, _input(rank, op, dtype, numel)):
        error = "modified the input copy kept aside"
    return {
        "key": (alg, op, str(dtype), numel),
        "error": error,
        "digest": _digest(t),
        "counts": stats.summary(),
        "element_size": t.element_size(),
        "messages": stats.messages if (op, dtype, numel) == ("sum", torch.float32, 7) else None,
    }


def _run_blocks(rank: int, world_size: int) -> dict[str, str | None]:
    """The building blocks against the matching torch.distributed collectives."""
    C = lk.collectives
    out: dict[str, str | None] = {}
    for numel in (3, 1023):
        x = _input(rank, "sum", torch.float64, numel)
        total = x.clone()
        dist.all_reduce(total)
        a, b = chunk_bounds(numel, world_size)[rank]
        t = x.clone()
        mine = C.reduce_scatter_ring(t)
        out[f"reduce_scatter_ring {numel}"] = _close(mine, total[a:b])
        g = torch.full((numel,), -1.0, dtype=torch.float64)
        g[a:b] = total[a:b]
        C.all_gather_ring(g)
        out[f"all_gather_ring {numel}"] = _close(g, total)
        root = world_size - 1
        t, want = x.clone(), x.clone()
        dist.reduce(want, dst=root, op=dist.ReduceOp.MAX)
        C.reduce_tree(t, op="max", root=root)
        out[f"reduce_tree {numel}"] = _close(t, want) if rank == root else None
        t, want = x.clone(), x.clone()
        dist.broadcast(want, src=root)
        C.broadcast_tree(t, root=root)
        out[f"broadcast_tree {numel}"] = _close(t, want)
    for alg, fn in ALGORITHMS.items():  # a non-contiguous 2-D input
        base = _input(rank, "sum", torch.float32, 15).view(3, 5)
        want = base.t().contiguous()
        dist.all_reduce(want)
        t = base.clone().t()
        fn(t)
        out[f"{alg} non-contiguous"] = _close(t, want)
    return out


def _run_all(rank: int, world_size: int) -> dict:
    rows = [_run_case(rank, *case) for case in _cases()]
    sub_rows = []
    if world_size >= 3:  # a subgroup without rank 0: peers are group ranks, not global ones
        members = list(range(1, world_size))
        sub = dist.new_group(members)  # every rank calls new_group, members or not
        if rank in members:
            for alg in ALGS:
                for op, dtype, numel in (("sum", torch.float32, 7), ("max", torch.int64, 1023)):
                    sub_rows.append(_run_case(rank, alg, op, dtype, numel, group=sub))
    return {"rows": rows, "sub_rows": sub_rows, "blocks": _run_blocks(rank, world_size)}


@functools.cache
def _results(world_size: int) -> list[dict]:
    return lk.launch(_run_all, world_size=world_size, backend="gloo", device="cpu", timeout=300)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_algorithm_equals_dist_all_reduce(world_size):
    results = _results(world_size)
    failures = [
        f"rank {rank} {row['key']}: {row['error']}"
        for rank, res in enumerate(results)
        for row in res["rows"] + res["sub_rows"]
        if row["error"] is not None
    ]
    failures += [
        f"rank {rank} {name}: {err}"
        for rank, res in enumerate(results)
        for name, err in res["blocks"].items()
        if err is not None
    ]
    assert not failures, "\n".join(failures[:20])
    assert len(results[0]["rows"]) == len(_cases())


def _run_eight(rank: int, world_size: int) -> list[dict]:
    cases = [
        (alg, op, dt, n)
        for alg in ("ring", "recursive_doubling", "rabenseifner")
        for op, dt, n in (
            ("sum", torch.float32, 1000),
            ("max", torch.int64, 7),
            ("avg", torch.float64, 3),
            ("sum", torch.bfloat16, 1023),
        )
    ]
    return [_run_case(rank, *case) for case in cases]


def test_eight_ranks_equal_dist_all_reduce_and_formulas():
    """p = 8 (log2 p = 3 steps per phase), a few cases: 8 ranks on 2 cores are slow."""
    results = lk.launch(_run_eight, world_size=8, backend="gloo", device="cpu", timeout=300)
    for rank, rows in enumerate(results):
        for row in rows:
            assert row["error"] is None, (rank, row["key"], row["error"])
            alg, _, _, numel = row["key"]
            want = _expected_counts(alg, 8, rank, numel, row["element_size"])
            assert row["counts"] == want, (rank, row["key"])
    for i, row in enumerate(results[0]):
        assert len({rows[i]["digest"] for rows in results}) == 1, row["key"]
    assert results[0][8]["counts"]["messages_sent"] == 6  # rabenseifner: 2·log2 8
    assert results[0][8]["counts"]["bytes_sent"] == 2 * 7 * 1000 // 8 * 4


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_rank_gets_bitwise_identical_result(world_size):
    results = _results(world_size)
    for i, row in enumerate(results[0]["rows"]):
        digests = {res["rows"][i]["digest"] for res in results}
        assert len(digests) == 1, f"ranks disagree bitwise on {row['key']}"


def _expected_counts(alg: str, p: int, rank: int, numel: int, element_size: int) -> dict:
    return {
        "messages_sent": expected_messages(alg, p, rank),
        "messages_received": expected_messages(alg, p, rank, direction="recv"),
        "bytes_sent": expected_bytes(alg, p, numel, element_size, rank),
        "bytes_received": expected_bytes(alg, p, numel, element_size, rank, direction="recv"),
    }


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_counted_traffic_equals_formula(world_size):
    results = _results(world_size)
    for rank, res in enumerate(results):
        for row in res["rows"]:
            alg, _, _, numel = row["key"]
            want = _expected_counts(alg, world_size, rank, numel, row["element_size"])
            assert row["counts"] == want, f"rank {rank} {row['key']}"
    members = list(range(1, world_size))  # the subgroup: counted by group rank and size
    for res, group_rank in zip((results[m] for m in members), range(len(members)), strict=True):
        for row in res["sub_rows"]:
            alg, _, _, numel = row["key"]
            want = _expected_counts(alg, len(members), group_rank, numel, row["element_size"])
            assert row["counts"] == want, f"group rank {group_rank} {row['key']}"


@pytest.mark.parametrize("world_size", (4, 5))
def test_who_sends_to_whom(world_size):
    """Ring: right neighbour only, p−1 steps per phase. Recursive doubling: partner r XOR 2^k."""
    p = world_size
    for rank, res in enumerate(_results(world_size)):
        msgs = {row["key"][0]: row["messages"] for row in res["rows"] if row["messages"]}
        sends = [m for m in msgs["ring"] if m.direction == "send"]
        assert {m.peer for m in sends} == {(rank + 1) % p}
        for phase in ("reduce-scatter", "all-gather"):
            assert [m.step for m in sends if m.phase == phase] == list(range(p - 1))
        rd = [m for m in msgs["recursive_doubling"] if m.phase == "exchange"]
        rab = [m.peer for m in msgs["rabenseifner"] if m.direction == "send"]
        if p == 4:
            assert [m.peer for m in rd if m.direction == "send"] == [rank ^ 1, rank ^ 2]
            assert rab == [rank ^ 2, rank ^ 1, rank ^ 1, rank ^ 2]  # halving, then doubling
        tree_sends = [m.peer for m in msgs["tree"] if m.direction == "send"]
        parent = [rank - (rank & -rank)] if rank else []
        assert sorted(tree_sends) == sorted(parent + tree_children(rank, p))


def _bad_inputs(rank: int, world_size: int) -> dict:
    out = {}
    for alg, fn in ALGORITHMS.items():
        cases = {
            "size": (torch.zeros(4 if rank == 1 else 3), "sum"),
            "dtype": (torch.zeros(3, dtype=torch.float64 if rank == 2 else torch.float32), "sum"),
            "op": (torch.zeros(3), "max" if rank == 2 else "sum"),
            "int avg": (torch.zeros(3, dtype=torch.int64), "avg"),
            "bitwise and": (torch.zeros(3, dtype=torch.int64), dist.ReduceOp.BAND),
        }
        for what, (t, op) in cases.items():
            try:
                fn(t, op=op)
                out[(alg, what)] = None
            except (ValueError, TypeError) as exc:
                out[(alg, what)] = (type(exc).__name__, str(exc))
    return out


def test_bad_inputs_raise_clear_errors_on_every_rank():
    results = lk.launch(_bad_inputs, world_size=3, backend="gloo", device="cpu", timeout=120)
    for rank, out in enumerate(results):
        for alg in ALGS:
            kind, msg = out[(alg, "size")]
            assert kind == "ValueError" and "rank 1: shape (4,)" in msg, (rank, alg, msg)
            assert "ranks 0, 2: shape (3,)" in msg
            kind, msg = out[(alg, "dtype")]
            assert kind == "ValueError" and "rank 2: shape (3,), float64" in msg
            kind, msg = out[(alg, "op")]
            assert kind == "ValueError" and "rank 2: shape (3,), float32, op max" in msg
            kind, msg = out[(alg, "int avg")]
            assert kind == "TypeError" and "floating-point" in msg
            kind, msg = out[(alg, "bitwise and")]
            assert kind == "ValueError" and "unsupported reduction op" in msg


def test_mismatch_surfaces_as_rank_error_not_a_hang():
    def fn(rank, world_size):
        lk.collectives.allreduce_ring(torch.ones(5 + rank))

    with pytest.raises(lk.RankError) as info:
        lk.launch(fn, world_size=2, backend="gloo", device="cpu", timeout=60)
    assert not isinstance(info.value, lk.LaunchTimeout)
    assert {f.exc_type for f in info.value.failures.values()} == {"ValueError"}


def test_time_allreduce_returns_one_median_per_size_same_on_all_ranks():
    from functools import partial

    def fn(rank, world_size):
        fns = {
            "ring": partial(lk.collectives.allreduce_ring, check=False),
            "dist.all_reduce": dist.all_reduce,
        }
        return lk.collectives.time_allreduce(fns, [1, 100], repeats=2)

    out = lk.launch(fn, world_size=2, backend="gloo", device="cpu", timeout=60)
    assert out[0] == out[1]
    assert set(out[0]) == {"ring", "dist.all_reduce"}
    assert all(len(v) == 2 and all(0 < s < 10 for s in v) for v in out[0].values())
    with pytest.raises(ValueError):
        lk.collectives.time_allreduce({}, [1], repeats=0)


# -- pure arithmetic: no processes ------------------------------------------------------------


@pytest.mark.parametrize("p", range(1, 9))
def test_chunks_match_tensor_split(p):
    for n in (0, 1, 3, 7, 8, 1000, 1023):
        want = [len(c) for c in torch.tensor_split(torch.arange(n), p)]
        assert chunk_sizes(n, p) == want
        bounds = chunk_bounds(n, p)
        assert [b - a for a, b in bounds] == want and bounds[-1][1] == n


@pytest.mark.parametrize("p", range(1, 17))
def test_message_formulas_closed_forms(p):
    n, es = 1000, 4
    ring = [expected_messages("ring", p, r) for r in range(p)]
    assert ring == [2 * (p - 1)] * p
    assert expected_bytes("ring", p, n, es) == 2 * (p - 1) * n * es  # each chunk: p−1 hops, ×2
    per_rank_max = 2 * (p - 1) * math.ceil(n / p) * es
    assert max(expected_bytes("ring", p, n, es, r) for r in range(p)) <= per_rank_max
    assert expected_messages("tree", p) == expected_messages("naive", p) == 2 * (p - 1)
    log_p = math.ceil(math.log2(p)) if p > 1 else 0
    assert max(expected_messages("tree", p, r) for r in range(p)) <= 2 * log_p
    assert expected_messages("naive", p, 0) == p - 1
    if p & (p - 1) == 0:  # power of two
        assert [expected_messages("recursive_doubling", p, r) for r in range(p)] == [log_p] * p
        assert [expected_messages("rabenseifner", p, r) for r in range(p)] == [2 * log_p] * p
    if p % 2 == 1 and p > 1:  # odd p: at least one rank folds out and sends once
        assert expected_messages("rabenseifner", p, 0) == 1
    for alg in ALGS:
        assert expected_messages(alg, p) == expected_messages(alg, p, direction="recv")
        assert expected_bytes(alg, p, n, es) == expected_bytes(alg, p, n, es, direction="recv")


@pytest.mark.parametrize("p", (1, 2, 4, 8, 16, 1024))
def test_rabenseifner_power_of_two_closed_form(p):
    """2·log2 p messages and 2(p−1)/p · n elements per rank (Thakur et al. 2005, §4)."""
    n, es, lg = 8192, 4, p.bit_length() - 1
    for r in {0, min(1, p - 1), p // 2, p - 1}:
        assert expected_messages("rabenseifner", p, r) == 2 * lg
        assert expected_bytes("rabenseifner", p, n, es, r) == 2 * (p - 1) * n // p * es
        assert expected_bytes("rabenseifner", p, n, es, r, direction="recv") == (
            2 * (p - 1) * n // p * es
        )


def test_rabenseifner_halving_then_doubling_windows():
    w = lk.collectives.halving_doubling_windows(5, 8)  # rank 5 = 0b101 of 8
    assert [(ph, peer) for ph, peer, _, _ in w] == [
        ("reduce-scatter", 1), ("reduce-scatter", 7), ("reduce-scatter", 4),
        ("all-gather", 4), ("all-gather", 7), ("all-gather", 1),
    ]  # fmt: skip
    assert [sent for _, _, sent, _ in w] == [(0, 4), (6, 8), (4, 5), (5, 6), (4, 6), (4, 8)]
    assert [got for _, _, _, got in w] == [(4, 8), (4, 6), (5, 6), (4, 5), (6, 8), (0, 4)]
    for bad in ((0, 3), (0, 6), (4, 4), (-1, 4)):
        with pytest.raises(ValueError, match="power-of-two"):
            lk.collectives.halving_doubling_windows(bad[0], bad[1])


def test_rabenseifner_non_power_of_two_known_values():
    # p=5: rank 0 folds into 1 (n in, n back); the p'=4 others halve and double.
    assert [expected_messages("rabenseifner", 5, r) for r in range(5)] == [1, 5, 4, 4, 4]
    assert [expected_messages("rabenseifner", 6, r) for r in range(6)] == [1, 5, 1, 5, 4, 4]
    n = 1000  # p' = 4 divides n: 2·3/4·n each, plus n for the unfold on the partners
    assert [expected_bytes("rabenseifner", 5, n, 1, r) for r in range(5)] == [
        1000, 2500, 1500, 1500, 1500
    ]  # fmt: skip
    assert expected_bytes("rabenseifner", 3, 10, 1, 1, direction="recv") == 10 + 10


def test_recursive_doubling_non_power_of_two_known_values():
    # p=5: p'=4, rem=1: rank 0 folds into 1; p=6: ranks 0 and 2 fold into 1 and 3.
    assert [expected_messages("recursive_doubling", 5, r) for r in range(5)] == [1, 3, 2, 2, 2]
    assert [expected_messages("recursive_doubling", 6, r) for r in range(6)] == [1, 3, 1, 3, 2, 2]
    assert [expected_messages("tree", 5, r) for r in range(5)] == [3, 1, 2, 1, 1]
    assert tree_children(0, 5) == [1, 2, 4] and tree_children(2, 5) == [3]


def test_formulas_refuse_bad_arguments():
    with pytest.raises(ValueError, match="unknown algorithm"):
        expected_messages("butterfly", 4)
    with pytest.raises(ValueError, match="unknown algorithm"):
        expected_messages("butterfly", 1)
    with pytest.raises(ValueError, match="not in range"):
        expected_bytes("ring", 4, 10, 4, rank=4)
    with pytest.raises(ValueError):
        expected_bytes("ring", 4, -1, 4)
    with pytest.raises(ValueError):
        chunk_sizes(3, 0)


def test_op_names():
    assert op_name(dist.ReduceOp.SUM) == "sum"
    assert op_name(dist.ReduceOp(dist.ReduceOp.MAX)) == "max"
    assert op_name("PROD") == "product" and op_name("avg") == "avg"
    with pytest.raises(ValueError, match="unsupported"):
        op_name(dist.ReduceOp.BAND)
