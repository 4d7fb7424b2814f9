"""Cases for tests/test_backends_shm.py: each collective on labkit_shm, on gloo and by hand.

Every rank can rebuild every rank's input (inputs depend only on the case and the rank), so
each case is checked twice on every rank: against gloo run on the same tensors in the same
launch (a gloo subgroup of the labkit_shm world), and against a single-process reference
computed from all the inputs. gloo has no int16 and its list all_to_all needs equal sizes;
those cases use the reference only.

``run_cases`` runs on every rank and returns ``{case name: error text or None}``. Three
groups run each case: the labkit_shm world (default sizes: one chunk, one-shot reductions),
a "tiny" labkit_shm group (4 KiB slots and mailboxes, always reduce-scatter + all-gather: a
1023-element tensor streams through several chunks) and gloo.
"""

from __future__ import annotations

import functools
import os
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

SIZES = (0, 1, 7, 1000, 1023)  # empty, smaller than p, not divisible by p, several chunks
FLOATS = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)
DTYPES = (*FLOATS, *INTS, torch.bool)
FLOAT_OPS = ("sum", "avg", "product", "min", "max")
INT_OPS = ("sum", "product", "min", "max", "band", "bor", "bxor")
REDOP = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
# (rtol, atol): sums of up to 8 values in another order and precision (gloo adds bf16/fp16
# pairwise, labkit_shm accumulates in float and rounds once).
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-12, 1e-12),
    torch.bfloat16: (2e-2, 1e-1),
    torch.float16: (1e-2, 1e-2),
}
GLOO_LACKS = (torch.int16,)
GLOO_CANNOT = ("all_to_all_list_uneven",)  # gloo's list all_to_all needs equal sizes
TINY_ENV = {
    "LABKIT_SHM_SLOT_BYTES": "4096",
    "LABKIT_SHM_MAIL_BYTES": "4096",
    "LABKIT_SHM_ONE_SHOT_BYTES": "0",
}


@dataclass(frozen=True)
class Case:
    kind: str
    dtype: torch.dtype
    numel: int
    op: str = ""
    root: int = 0

    @property
    def name(self) -> str:
        dt = str(self.dtype).removeprefix("torch.")
        return f"{self.kind}-{self.op or 'none'}-{dt}-{self.numel}-root{self.root}"


def ops_for(dtype: torch.dtype) -> tuple[str, ...]:
    return FLOAT_OPS if dtype.is_floating_point else INT_OPS


def all_cases(world_size: int) -> list[Case]:
    """Every case for one world size (the same list on every rank and in the test)."""
    last = world_size - 1
    cases = [Case("all_reduce", dt, n, op) for dt in DTYPES for op in ops_for(dt) for n in SIZES]
    for dt in DTYPES:
        few_ops = ("sum", "max", "avg") if dt.is_floating_point else ("sum", "min", "bxor")
        for n in SIZES:
            cases.append(Case("broadcast", dt, n, root=last))
            cases.append(Case("all_gather", dt, n))
            cases.append(Case("all_gather_into_tensor", dt, n))
            cases.append(Case("all_to_all_single", dt, n))
            for op in few_ops:
                cases.append(Case("reduce", dt, n, op, root=last))
                cases.append(Case("reduce_scatter", dt, n, op))
                cases.append(Case("reduce_scatter_tensor", dt, n, op))
        for n in (0, 7, 1023):
            cases.append(Case("gather", dt, n, root=last))
            cases.append(Case("scatter", dt, n, root=last))
            cases.append(Case("all_to_all_uneven", dt, n))
            cases.append(Case("all_to_all", dt, n))
            cases.append(Case("all_to_all_list_uneven", dt, n))
    return cases


def make_input(case: Case, rank: int, salt: int = 0, numel: int | None = None) -> torch.Tensor:
    """Rank ``rank``'s input for ``case``: the same tensor wherever it is built."""
    numel = case.numel if numel is None else numel
    seed = zlib.crc32(repr((case.name, rank, salt)).encode())
    gen = torch.Generator().manual_seed(seed)
    dt = case.dtype
    if dt == torch.bool:
        return torch.rand(numel, generator=gen) < 0.5
    if not dt.is_floating_point:
        lo, hi = (-3, 4) if case.op == "product" else (-100, 100)
        if dt == torch.uint8:
            lo, hi = (0, 4) if case.op == "product" else (0, 256)
        return torch.randint(lo, hi, (numel,), generator=gen).to(dt)
    if case.op == "product":  # magnitudes near 1: no overflow over 8 ranks
        x = torch.rand(numel, generator=gen, dtype=torch.float64) + 0.5
        return (x * torch.where(torch.rand(numel, generator=gen) < 0.5, -1.0, 1.0)).to(dt)
    return torch.randn(numel, generator=gen, dtype=torch.float64).to(dt)


def reference_reduce(op: str, xs: list[torch.Tensor]) -> torch.Tensor:
    """The reduction of ``xs`` computed exactly (float64 / int64) and cast back."""
    dt = xs[0].dtype
    if dt == torch.bool:
        s = torch.stack([x.long() for x in xs]).sum(0)
        res = {"sum": s > 0, "max": s > 0, "bor": s > 0, "bxor": s % 2 == 1}
        return res.get(op, s == len(xs))  # product, min, band: all true
    wide = torch.stack([x.double() if dt.is_floating_point else x.long() for x in xs])
    if op in ("band", "bor", "bxor"):
        fn = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op]
        return functools.reduce(fn, list(wide)).to(dt)
    fns = {
        "sum": lambda w: w.sum(0),
        "avg": lambda w: w.mean(0),
        "product": lambda w: w.prod(0),
        "min": lambda w: w.amin(0),
        "max": lambda w: w.amax(0),
    }
    return fns[op](wide).to(dt)


def mismatch(got: torch.Tensor, want: torch.Tensor, what: str) -> str | None:
    """None when equal (exactly for integers, within TOL for floats), else what differs."""
    if got.dtype != want.dtype or got.shape != want.shape:
        return f"{what}: got {got.dtype}{list(got.shape)}, want {want.dtype}{list(want.shape)}"
    if got.dtype in TOL:
        rtol, atol = TOL[got.dtype]
        try:
            torch.testing.assert_close(got, want, rtol=rtol, atol=atol)
        except AssertionError as exc:
            return f"{what}: " + " ".join(str(exc).split("\n")[:3])
        return None
    if not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].flatten().tolist()
        return f"{what}: differs at {bad}: got {got[bad].tolist()}, want {want[bad].tolist()}"
    return None


def _uneven_rows(i: int, j: int) -> int:
    return (i + j + 1) % 3  # rows rank i sends rank j in all_to_all_uneven (0, 1 or 2)


def _list_numel(case: Case, i: int, j: int) -> int:
    return (case.numel + i + 2 * j) % 1024  # elements rank i sends rank j in all_to_all


def run_one(case: Case, rank: int, n: int, group) -> list[torch.Tensor]:
    """Run ``case`` on ``group``; return what this rank can observe afterwards."""
    k, dt, m, root = case.kind, case.dtype, case.numel, case.root
    op = REDOP.get(case.op)
    mine = make_input(case, rank)
    if k == "all_reduce":
        dist.all_reduce(mine, op, group=group)
        return [mine]
    if k == "reduce":
        dist.reduce(mine, root, op, group=group)
        return [mine] if rank == root else []
    if k == "broadcast":
        dist.broadcast(mine, root, group=group)
        return [mine]
    if k == "all_gather":
        outs = [torch.empty(m, dtype=dt) for _ in range(n)]
        dist.all_gather(outs, mine, group=group)
        return outs
    if k == "all_gather_into_tensor":
        out = torch.empty(n * m, dtype=dt)
        dist.all_gather_into_tensor(out, mine, group=group)
        return [out]
    if k == "reduce_scatter":
        out = torch.empty(m, dtype=dt)
        dist.reduce_scatter(out, [make_input(case, rank, salt=j) for j in range(n)], op, group)
        return [out]
    if k == "reduce_scatter_tensor":
        out = torch.empty(m, dtype=dt)
        dist.reduce_scatter_tensor(out, make_input(case, rank, numel=n * m), op, group)
        return [out]
    if k == "all_to_all_single":
        out = torch.empty(n * m, dtype=dt)
        dist.all_to_all_single(out, make_input(case, rank, numel=n * m), group=group)
        return [out]
    if k == "all_to_all_uneven":
        sends = [_uneven_rows(rank, j) for j in range(n)]
        recvs = [_uneven_rows(i, rank) for i in range(n)]
        inp = make_input(case, rank, numel=sum(sends) * m).view(sum(sends), m)
        out = torch.empty(sum(recvs), m, dtype=dt)
        dist.all_to_all_single(out, inp, recvs, sends, group=group)
        return [out]
    if k == "all_to_all":
        outs = [torch.empty(m, dtype=dt) for _ in range(n)]
        dist.all_to_all(outs, [make_input(case, rank, salt=j) for j in range(n)], group=group)
        return outs
    if k == "all_to_all_list_uneven":
        ins = [make_input(case, rank, j, _list_numel(case, rank, j)) for j in range(n)]
        outs = [torch.empty(_list_numel(case, i, rank), dtype=dt) for i in range(n)]
        dist.all_to_all(outs, ins, group=group)
        return outs
    if k == "gather":
        outs = [torch.empty(m, dtype=dt) for _ in range(n)] if rank == root else None
        dist.gather(mine, outs, root, group=group)
        return outs or []
    if k == "scatter":
        ins = [make_input(case, rank, salt=j) for j in range(n)] if rank == root else None
        out = torch.empty(m, dtype=dt)
        dist.scatter(out, ins, root, group=group)
        return [out]
    raise ValueError(f"unknown case kind {k}")


def expected(case: Case, rank: int, n: int) -> list[torch.Tensor]:
    """What ``run_one`` should observe on ``rank``, from the inputs alone."""
    k, m, root, op = case.kind, case.numel, case.root, case.op
    every = [make_input(case, r) for r in range(n)]
    if k == "all_reduce":
        return [reference_reduce(op, every)]
    if k == "reduce":
        return [reference_reduce(op, every)] if rank == root else []
    if k == "broadcast":
        return [every[root]]
    if k in ("all_gather", "gather"):
        return every if k == "all_gather" or rank == root else []
    if k == "all_gather_into_tensor":
        return [torch.cat(every)]
    if k == "reduce_scatter":
        return [reference_reduce(op, [make_input(case, r, salt=rank) for r in range(n)])]
    if k == "reduce_scatter_tensor":
        parts = [make_input(case, r, numel=n * m)[rank * m : (rank + 1) * m] for r in range(n)]
        return [reference_reduce(op, parts)]
    if k == "all_to_all_single":
        return [
            torch.cat(
                [make_input(case, i, numel=n * m)[rank * m : (rank + 1) * m] for i in range(n)]
            )
        ]
    if k == "all_to_all_uneven":
        blocks = []
        for i in range(n):
            sends = [_uneven_rows(i, j) for j in range(n)]
            inp = make_input(case, i, numel=sum(sends) * m).view(sum(sends), m)
            blocks.append(inp[sum(sends[:rank]) : sum(sends[: rank + 1])])
        return [torch.cat(blocks)]
    if k == "all_to_all":
        return [make_input(case, i, salt=rank) for i in range(n)]
    if k == "all_to_all_list_uneven":
        return [make_input(case, i, rank, _list_numel(case, i, rank)) for i in range(n)]
    if k == "scatter":
        return [make_input(case, root, salt=rank)]
    raise ValueError(f"unknown case kind {k}")


def _compare(got: list, want: list, what: str) -> str | None:
    if len(got) != len(want):
        return f"{what}: {len(got)} outputs, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        err = mismatch(g, w, f"{what} output {i}")
        if err:
            return err
    return None


def tiny_group():
    """A labkit_shm group of every rank with 4 KiB slots and mailboxes (many chunks)."""
    saved = {k: os.environ.get(k) for k in TINY_ENV}
    os.environ.update(TINY_ENV)
    try:
        return dist.new_group(backend="labkit_shm")
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_cases(rank: int, world_size: int) -> dict[str, str | None]:
    """On every rank: each case on labkit_shm (world and tiny) vs gloo and the reference."""
    groups = {"shm": dist.group.WORLD, "shm-tiny": tiny_group()}
    gloo = dist.new_group(backend="gloo")
    results: dict[str, str | None] = {}
    for case in all_cases(world_size):
        want = expected(case, rank, world_size)
        errors = []
        try:
            from_gloo = None
            if case.dtype not in GLOO_LACKS and case.kind not in GLOO_CANNOT:
                from_gloo = run_one(case, rank, world_size, gloo)
                errors.append(_compare(from_gloo, want, "gloo vs reference"))
            for name, g in groups.items():
                got = run_one(case, rank, world_size, g)
                errors.append(_compare(got, want, f"{name} vs reference"))
                if from_gloo is not None:
                    errors.append(_compare(got, from_gloo, f"{name} vs gloo"))
        except Exception as exc:  # noqa: BLE001 - reported per case
            errors.append(f"raised {type(exc).__name__}: {exc}")
        results[case.name] = "; ".join(e for e in errors if e) or None
    return results
