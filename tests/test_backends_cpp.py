"""labkit.backends.cpp: the C++ c10d backend gives gloo's results, its Work objects complete,
it cleans up the store, it builds once however many processes import it at the same moment,
and without a compiler importing it says what to install.

The collectives run once per world size and backend (one launch each) over every case
(op × dtype × size, roots, async work); the tests compare the labkit_cpp rows with gloo's.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import zlib
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.backends.cpp_build import MISSING_COMPILER, available, load_locked

ROOT = Path(__file__).resolve().parents[1]
OK, WHY = available()
needs_compiler = pytest.mark.skipif(not OK, reason=WHY)

WORLD_SIZES = (2, 3)
OPS = {
    "sum": dist.ReduceOp.SUM,
    "product": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
    "band": dist.ReduceOp.BAND,
    "bor": dist.ReduceOp.BOR,
    "bxor": dist.ReduceOp.BXOR,
}
FLOAT_ONLY, INT_ONLY = {"avg"}, {"band", "bor", "bxor"}
DTYPES = (torch.float32, torch.float64, torch.int64)
SIZES = (0, 1, 3, 7, 1000, 1023)  # empty, fewer than the ranks, not divisible by 2 or 3
BIG = 1_100_001  # float32: 4.4 MB, more than one 4 MiB store value
# (rtol, atol): gloo adds in another order than labkit_cpp's rank order 0, 1, ..., p-1.
TOL = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-12, 1e-12), torch.int64: (0, 0)}


def _input(rank: int, case: str, dtype: torch.dtype, numel: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(repr((rank, case, str(dtype))).encode()))
    if dtype == torch.int64:
        lo, hi = (-3, 4) if case == "product" else (-1000, 1000)
        return torch.randint(lo, hi, (numel,), generator=gen)
    x = torch.rand(numel, generator=gen, dtype=torch.float64) + 0.5  # products stay near 1
    if case != "product":
        x = torch.randn(numel, generator=gen, dtype=torch.float64)
    return x.to(dtype)


def _cases() -> list[tuple[str, torch.dtype, int]]:
    return [
        (op, dtype, n)
        for op in OPS
        for dtype in DTYPES
        for n in SIZES
        if not (op in FLOAT_ONLY and not dtype.is_floating_point)
        and not (op in INT_ONLY and dtype.is_floating_point)
    ]


def _collectives(rank: int, world_size: int) -> dict:
    """Every case through the default group's backend; returns the tensors each rank holds."""
    out: dict = {}
    for op, dtype, n in _cases():
        t = _input(rank, op, dtype, n)
        dist.all_reduce(t, op=OPS[op])
        out[("all_reduce", op, str(dtype), n)] = t
    for dtype in (torch.float32, torch.float64):
        t = _input(rank, "sum", dtype, BIG)
        dist.all_reduce(t)
        out[("all_reduce", "sum", str(dtype), BIG)] = t
    for root in range(world_size):
        for dtype in DTYPES:
            for n in (0, 5, 1023):
                t = _input(rank, f"broadcast {root}", dtype, n)
                dist.broadcast(t, src=root)
                out[("broadcast", root, str(dtype), n)] = t
    t = _input(rank, "big broadcast", torch.float32, BIG)
    dist.broadcast(t, src=world_size - 1)
    out[("broadcast", world_size - 1, "torch.float32", BIG)] = t
    # Non-contiguous tensors (a transposed view) are written back in place.
    t = _input(rank, "sum", torch.float64, 15).view(3, 5).t()
    dist.all_reduce(t)
    out[("all_reduce", "transposed")] = t.clone()
    t = _input(rank, "broadcast", torch.float64, 15).view(3, 5).t()
    dist.broadcast(t, src=1)
    out[("broadcast", "transposed")] = t.clone()
    # async_op=True: the Work is complete and its future holds the result.
    t = _input(rank, "async", torch.float32, 1000)
    work = dist.all_reduce(t, async_op=True)
    waited = work.wait()
    out[("async", "all_reduce")] = (waited, work.is_completed(), work.get_future().value()[0], t)
    t = _input(rank, "async broadcast", torch.int64, 7)
    work = dist.broadcast(t, src=0, async_op=True)
    out[("async", "broadcast")] = (work.wait(), work.is_completed(), t)
    gathered = [torch.empty(7, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(gathered, _input(rank, "gather", torch.int64, 7))
    out[("all_gather",)] = gathered
    if world_size >= 3:  # a subgroup without rank 0: its own backend over its own store prefix
        sub = dist.new_group(list(range(1, world_size)))  # every rank calls new_group
        if rank > 0:
            t = _input(rank, "subgroup", torch.float64, 1000)
            dist.all_reduce(t, group=sub)
            out[("subgroup", "all_reduce")] = t
    dist.barrier()
    return out


@functools.cache
def _results(backend: str, world_size: int) -> list[dict]:
    if backend == "labkit_cpp":
        import labkit.backends.cpp  # noqa: F401 - build here once, not in the ranks
    return lk.launch(_collectives, world_size=world_size, backend=backend, timeout=300)


def _compare(got, want, key) -> None:
    if isinstance(want, (list, tuple)):
        assert len(got) == len(want), key
        for g, w in zip(got, want, strict=True):
            _compare(g, w, key)
    elif isinstance(want, torch.Tensor):
        rtol, atol = TOL[want.dtype]
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{key}: {m}")
    else:
        assert got == want, key


@needs_compiler
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_collectives_equal_gloo(world_size):
    cpp, gloo = _results("labkit_cpp", world_size), _results("gloo", world_size)
    for rank in range(world_size):
        assert cpp[rank].keys() == gloo[rank].keys()
        for key, want in gloo[rank].items():
            _compare(cpp[rank][key], want, (rank, *key))


@needs_compiler
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_rank_reduces_to_the_same_bits(world_size):
    results = _results("labkit_cpp", world_size)
    for key, value in results[0].items():
        if key[0] != "all_reduce":
            continue
        for rank in range(1, world_size):
            assert torch.equal(results[rank][key], value), (rank, key)


@needs_compiler
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_async_work_is_complete_and_its_future_holds_the_result(world_size):
    for res in _results("labkit_cpp", world_size):
        waited, completed, from_future, tensor = res[("async", "all_reduce")]
        assert waited is True and completed is True
        assert torch.equal(from_future, tensor)
        assert res[("async", "broadcast")][:2] == (True, True)


def _train_ddp(rank: int, world_size: int, steps: int = 3) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    del ddp, opt
    return params


@needs_compiler
def test_ddp_on_labkit_cpp_trains_like_on_gloo():
    import labkit.backends.cpp  # noqa: F401

    cpp = lk.launch(_train_ddp, world_size=2, backend="labkit_cpp", timeout=300)
    gloo = lk.launch(_train_ddp, world_size=2, backend="gloo", timeout=300)
    for a, b in zip(cpp[0], cpp[1], strict=True):
        assert torch.equal(a, b)  # replicas stay identical
    for a, b in zip(cpp[0], gloo[0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _unsupported(rank: int, world_size: int) -> str:
    try:
        dist.reduce(torch.ones(3), dst=0)
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return "no error"


@needs_compiler
def test_unsupported_collective_says_so():
    import labkit.backends.cpp  # noqa: F401

    messages = lk.launch(_unsupported, world_size=2, backend="labkit_cpp")
    assert all("labkit_cpp does not support reduce" in m for m in messages), messages


# The backend itself, on threads over one in-memory store: no processes, so the store's keys
# and the timeout can be checked directly.


def _on_threads(world_size: int, body, timeout_s: float = 20.0) -> tuple[list, list, int]:
    """Run ``body(backend, rank)`` on one thread per rank; results, errors, store keys left."""
    from labkit.backends import cpp

    store = dist.HashStore()
    results: list = [None] * world_size
    errors: list = [None] * world_size

    def run(rank: int) -> None:
        backend = cpp.create_backend(
            dist.PrefixStore("group/", store), rank, world_size, timedelta(seconds=timeout_s)
        )
        try:
            results[rank] = body(backend, rank)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world_size)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    return results, errors, store.num_keys()


@needs_compiler
def test_store_keys_are_deleted_after_each_collective():
    def body(backend, rank):
        t = torch.arange(6.0) * (rank + 1)
        backend.allreduce([t]).wait()
        b = torch.full((BIG,), float(rank))
        backend.broadcast([b], dist.BroadcastOptions()).wait()
        out = [[torch.empty(6) for _ in range(3)]]
        backend.allgather(out, [t]).wait()
        backend.barrier().wait()
        return t, b[:3], out[0]

    results, errors, keys_left = _on_threads(3, body)
    assert errors == [None] * 3
    assert keys_left == 0
    for t, b, gathered in results:
        torch.testing.assert_close(t, torch.arange(6.0) * 6, rtol=0, atol=0)
        assert torch.equal(b, torch.zeros(3))
        assert all(torch.equal(g, t) for g in gathered)


@needs_compiler
def test_missing_peer_times_out_and_mismatched_shapes_are_named():
    from labkit.backends import cpp

    lonely = cpp.create_backend(dist.HashStore(), 0, 2, timedelta(seconds=0.3))
    with pytest.raises(dist.DistStoreError, match="Timed out after 300 ms waiting for rank 1"):
        lonely.allreduce([torch.ones(2)])

    def body(backend, rank):
        backend.allreduce([torch.ones(4 + rank)]).wait()

    _, errors, _ = _on_threads(2, body, timeout_s=5)
    assert all("same shape and dtype" in str(e) for e in errors), errors


# Building: once for N processes, and a clear message without a compiler.


@needs_compiler
@pytest.mark.slow
def test_processes_importing_at_once_compile_once(tmp_path):
    build_dir = tmp_path / "labkit_cpp_backend"
    build_dir.mkdir()
    (build_dir / "lock").touch()  # cpp_extension's baton, left behind by a killed build
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(tmp_path))
    code = (
        "import dataclasses, json, labkit.backends.cpp as c; "
        "print(json.dumps(dataclasses.asdict(c.build_info())))"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=400)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    infos = [json.loads(o.strip().splitlines()[-1]) for o in outs]
    assert sorted(i["compiled"] for i in infos) == [False, False, True]
    # .ninja_log: one "start end mtime output hash" line per command ninja ran.
    lines = (build_dir / ".ninja_log").read_text().splitlines()
    outputs = [line.split("\t")[3] for line in lines if not line.startswith("#")]
    assert outputs.count("labkit_backend.o") == 1, lines


def test_missing_compiler_gives_the_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no c++, g++ or clang++
    monkeypatch.delenv("CXX", raising=False)
    ok, why = available()
    assert not ok
    assert why.startswith("labkit_cpp needs a C++ compiler (g++ or clang++)")
    assert "build-essential" in why and "Xcode CLT" in why
    with pytest.raises(RuntimeError, match=r"needs a C\+\+ compiler \(g\+\+ or clang\+\+\)"):
        load_locked("labkit_never_built", [str(tmp_path / "none.cpp")])
    monkeypatch.setenv("CXX", "/no/such/compiler")
    ok, why = available()
    assert not ok and "CXX='/no/such/compiler'" in why


def test_importing_without_a_compiler_raises_the_clear_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "CXX"}
    env["PATH"] = str(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", "import labkit.backends.cpp"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: labkit_cpp needs a C++ compiler (g++ or clang++)")
    assert MISSING_COMPILER.split("{found}")[1].strip() in last


@needs_compiler
def test_available_names_the_compiler_and_registration_is_idempotent():
    from labkit.backends import cpp

    ok, why = available()
    assert ok and "compiler" in why
    cpp.register()
    cpp.register()
    assert dist.Backend.backend_list.count("labkit_cpp") == 1
    assert dist.Backend.backend_capability["labkit_cpp"] == ["cpu"]
    assert cpp.build_info().library.endswith((".so", ".pyd"))
