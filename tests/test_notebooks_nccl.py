"""What the notebooks do that is right on gloo and wrong on NCCL or on one GPU, checked on CPU.

Each check names a bug that only shows on GPUs and catches it here, without one: torch's own
``nn.DataParallel`` with GPUs mocked (it moves a single GPU's module in place), and the
notebooks' code cells read with ``ast`` as tests/test_device_consistency.py does (a Work's
``is_completed()`` asserted right after ``wait()``, which NCCL does not promise; a host clock
read without synchronising the device first).
"""

from __future__ import annotations

import ast
import copy
import importlib

import pytest
import torch

from tests.ast_parse import parse
from tests.test_device_consistency import (
    NOTEBOOKS,
    bindings,
    launches,
    may_be_cuda,
    module_level,
    notebook_source,
)

# -- nn.DataParallel on one GPU moves the module it is given -------------------------------


@pytest.fixture
def mocked_gpus(monkeypatch):
    """DataParallel's view of a machine with ``n`` GPUs; ``Module.to`` records instead of moving."""
    data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")

    moved: list[tuple[torch.nn.Module, tuple]] = []

    def set_count(n: int) -> list[tuple[torch.nn.Module, tuple]]:
        monkeypatch.setattr(data_parallel, "_get_available_device_type", lambda: "cuda")
        monkeypatch.setattr(data_parallel, "_get_all_device_indices", lambda: list(range(n)))
        monkeypatch.setattr(data_parallel, "_check_balance", lambda ids: None)
        monkeypatch.setattr(torch.nn.Module, "to", lambda self, *a, **k: moved.append((self, a)))
        return moved

    return set_count


def test_dataparallel_on_one_gpu_moves_the_module_it_wraps(mocked_gpus):
    """The bug of 06's first version: DataParallel(model) moved the notebook's CPU model."""
    moved = mocked_gpus(1)
    model = torch.nn.Linear(2, 2)
    dp = torch.nn.DataParallel(model, device_ids=[0])
    assert dp.device_ids == [0]
    assert [(m, str(a[0])) for m, a in moved] == [(model, "cuda:0")]  # in place: model itself


def test_dataparallel_given_a_copy_leaves_the_model_alone(mocked_gpus):
    """06's pattern: a copy goes to device_ids[0] first, and DataParallel wraps the copy."""
    moved = mocked_gpus(1)
    model = torch.nn.Linear(2, 2)
    dp_module = copy.deepcopy(model)
    dp_module.to(torch.device("cuda:0"))  # what the notebook does (here, recorded)
    torch.nn.DataParallel(dp_module, device_ids=[0])
    assert all(m is dp_module for m, _ in moved) and len(moved) == 2
    assert next(model.parameters()).device.type == "cpu"


@pytest.mark.parametrize("n", [2, 8])
def test_dataparallel_without_device_ids_takes_every_visible_gpu(mocked_gpus, n):
    """06's claim: its constructor takes every GPU torch sees, whatever the notebook's device."""
    mocked_gpus(n)
    assert torch.nn.DataParallel(torch.nn.Linear(2, 2)).device_ids == list(range(n))


def dataparallel_wrapping_a_kept_model(source: str) -> list[str]:
    """``nn.DataParallel(x)`` calls whose module is a model the notebook keeps using: with one
    GPU DataParallel moves it to cuda:0 in place. A copy (``copy.deepcopy``) or a freshly
    built model (``make_model().cuda(0)``) is safe."""
    tree = parse(source)
    binds, bad = bindings(tree), []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if not ast.unparse(call.func).endswith("DataParallel") or not call.args:
            continue
        if ast.unparse(call.func).endswith("DistributedDataParallel"):
            continue
        module = call.args[0]
        while isinstance(module, ast.Call) and isinstance(module.func, ast.Attribute):
            if module.func.attr not in ("to", "cuda"):
                break
            module = module.func.value  # x.to(dev) / x.cuda(0) move x itself
        if isinstance(module, ast.Call):
            continue  # built here: nobody else holds it
        values = binds.get(module.id, []) if isinstance(module, ast.Name) else []
        if not values or not all("copy.deepcopy(" in ast.unparse(v) for _, v in values):
            bad.append(f"line {call.lineno}: {ast.unparse(call)[:70]}")
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_notebooks_wrap_a_copy_in_dataparallel(path):
    bad = dataparallel_wrapping_a_kept_model(notebook_source(path))
    assert not bad, f"{path.name}: give DataParallel copy.deepcopy(model).to(dev0): {bad}"


def test_the_dataparallel_scan_finds_a_wrapped_model():
    bad = "model = make()\ndp = torch.nn.DataParallel(model, device_ids=[0])\n"
    assert dataparallel_wrapping_a_kept_model(bad) == [
        "line 2: torch.nn.DataParallel(model, device_ids=[0])"
    ]
    assert dataparallel_wrapping_a_kept_model("dp = torch.nn.DataParallel(model.cuda(0))\n")
    good = (
        "dp_module = copy.deepcopy(model).to(dev0)\n"
        "dp = torch.nn.DataParallel(dp_module, device_ids=[0])\n"
        "dp2 = torch.nn.DataParallel(gpu_model().cuda(0))\n"
    )
    assert dataparallel_wrapping_a_kept_model(good) == []


# -- Work.is_completed() right after wait(): True on gloo, not promised on NCCL -------------


def _is_completed(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "is_completed"
    )


def completion_paths(fn: ast.FunctionDef) -> set[tuple[int, ...]]:
    """Where ``fn`` returns a Work's ``is_completed()``: index paths into its return value."""
    names = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs = list(zip(target.elts, node.value.elts, strict=False))
                names |= {t.id for t, v in pairs if isinstance(t, ast.Name) and _is_completed(v)}
    paths: set[tuple[int, ...]] = set()

    def visit(expr: ast.expr, path: tuple[int, ...]) -> None:
        if _is_completed(expr) or isinstance(expr, ast.Name) and expr.id in names:
            paths.add(path)
        elif isinstance(expr, (ast.Tuple, ast.List)):
            for i, elt in enumerate(expr.elts):
                visit(elt, (*path, i))

    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            visit(node.value, ())
    return paths


def _narrow(paths: set, index: int) -> set:
    return {p[1:] for p in paths if p and p[0] == index}


def _target_paths(target: ast.expr, name: str, paths: set) -> set | None:
    """The paths that ``name`` gets when ``target`` unpacks a value holding ``paths``."""
    if isinstance(target, ast.Name):
        return paths if target.id == name else None
    if isinstance(target, ast.Tuple):
        for i, elt in enumerate(target.elts):
            if not isinstance(elt, ast.Starred):
                got = _target_paths(elt, name, _narrow(paths, i))
                if got is not None:
                    return got
    return None


def _gloo_guarded(node: ast.AST, parents: dict) -> bool:
    while id(node) in parents:
        parent = parents[id(node)]
        if isinstance(parent, ast.If):
            test = ast.unparse(parent.test)
            if ("'gloo'" in test and node in parent.body) or (
                "'nccl'" in test and node in parent.orelse
            ):
                return True
        node = parent
    return False


class _Results:
    """Where the launch results of functions returning ``is_completed()`` flow, by name."""

    def __init__(self, tree: ast.AST) -> None:
        self.parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
        fns = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        self.returns = {fn.name: paths for fn in fns if (paths := completion_paths(fn))}
        self.assigns: dict[str, list[tuple[int, ast.expr, ast.expr]]] = {}
        for node in module_level(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                for name in ast.walk(node.targets[0]):
                    if isinstance(name, ast.Name):
                        entry = (node.lineno, node.targets[0], node.value)
                        self.assigns.setdefault(name.id, []).append(entry)

    def value(self, expr: ast.expr) -> tuple[bool, set]:
        """``(is a list over ranks, completion paths in each item)`` of ``expr``."""
        if isinstance(expr, ast.Name):
            return self.name(expr)
        if isinstance(expr, ast.Subscript):
            is_list, paths = self.value(expr.value)
            if is_list:  # ranks[:2] stays a list; ranks[r] is rank r's item
                return isinstance(expr.slice, ast.Slice), paths
            if isinstance(expr.slice, ast.Constant):
                return False, _narrow(paths, expr.slice.value)
            return False, paths
        if isinstance(expr, ast.Call) and expr.args and isinstance(expr.args[0], ast.Name):
            if ast.unparse(expr.func).rsplit(".", 1)[-1] in ("run", "launch"):
                return True, self.returns.get(expr.args[0].id, set())
        return False, set()

    def name(self, name: ast.Name) -> tuple[bool, set]:
        node = name
        while id(node) in self.parents:  # a loop variable: the loop that binds it
            node = self.parents[id(node)]
            loops = node.generators if hasattr(node, "generators") else [node]
            for loop in loops:
                if isinstance(loop, (ast.For, ast.comprehension)) and name.id in {
                    n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)
                }:
                    it, enum = loop.iter, False
                    if isinstance(it, ast.Call) and ast.unparse(it.func) == "enumerate":
                        it, enum = it.args[0], True
                    is_list, paths = self.value(it)
                    if not is_list:
                        return False, set()
                    paths = {(1, *p) for p in paths} if enum else paths
                    return False, _target_paths(loop.target, name.id, paths) or set()
        before = sorted(
            (a for a in self.assigns.get(name.id, []) if a[0] < name.lineno), key=lambda a: a[0]
        )
        if not before:
            return False, set()
        _, target, value = before[-1]  # the latest assignment above
        is_list, paths = self.value(value)
        if isinstance(target, ast.Tuple) and is_list:  # a run() that splits: zip(*results)
            index = next(i for i, t in enumerate(target.elts) if getattr(t, "id", "") == name.id)
            return True, _narrow(paths, index)
        return (is_list, paths) if isinstance(target, ast.Name) else (False, set())

    def reads_completion(self, name: ast.Name) -> bool:
        is_list, paths = self.name(name)
        here = name
        while isinstance(self.parents.get(id(here)), (ast.Subscript, ast.Call)):
            here = self.parents[id(here)]  # results[:2], enumerate(results)
        loop = self.parents.get(id(here))
        if isinstance(loop, (ast.For, ast.comprehension)) and loop.iter is here:
            return False  # iterated over: what the loop variables read is checked on them
        here = name
        while isinstance(self.parents.get(id(here)), ast.Subscript) and paths:
            sub = self.parents[id(here)]
            if is_list:
                is_list = isinstance(sub.slice, ast.Slice)
            elif isinstance(sub.slice, ast.Constant):
                paths = _narrow(paths, sub.slice.value)
            here = sub
        return bool(paths)


def completion_asserted_after_wait(source: str) -> list[str]:
    """Asserts on a Work's ``is_completed()`` that are not guarded to gloo (by a test of the
    backend that carried the tensors): on NCCL ``wait()`` only makes the current stream wait,
    so right after it ``is_completed()`` may be False (``Work.wait``'s docstring)."""
    tree = parse(source)
    results, bad = _Results(tree), []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assert) or _gloo_guarded(node, results.parents):
            continue
        names = [
            n for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
        ]
        # inside a rank, asserting it is the bug itself; outside, reading the returned flag
        if any(map(_is_completed, ast.walk(node))) or any(map(results.reads_completion, names)):
            bad.append(f"line {node.lineno}: {ast.unparse(node)[:70]}")
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_completion_is_asserted_only_where_gloo_carried_the_tensors(path):
    bad = completion_asserted_after_wait(notebook_source(path))
    assert not bad, (
        f"{path.name}: is_completed() right after wait() is True on gloo only (NCCL's wait() "
        f"orders the stream); guard these with the carrying backend == 'gloo': {bad}"
    )


def test_the_completion_scan_finds_what_it_is_for():
    rank_side = (
        "def nonblocking(rank, world_size):\n"
        "    work = dist.isend(x, dst=1)\n"
        "    work.wait()\n"
        "    return type(work).__name__, work.is_completed(), x.tolist(), lk.device_backend()\n"
    )
    old_01 = rank_side + (
        "handles = run(nonblocking)\n"
        "assert handles[1][2] == [0.0, 1.0]\n"  # data, not completion: fine
        "assert all(h[1] for h in handles[:2])\n"
    )
    assert completion_asserted_after_wait(old_01) == [
        "line 7: assert all((h[1] for h in handles[:2]))"
    ]
    fixed_01 = rank_side + (
        "handles = run(nonblocking)\n"
        "if handles[0][3] == 'gloo':\n"
        "    assert all(h[1] for h in handles[:2])\n"
    )
    assert completion_asserted_after_wait(fixed_01) == []
    old_02 = (
        "def async_demo(rank, world_size):\n"
        "    work = dist.all_reduce(x, async_op=True)\n"
        "    work.wait()\n"
        "    return type(work).__name__, (work.is_completed(), busy > 0, x.tolist())\n"
        "kinds, results = run(async_demo)\n"
        "assert all(k == 'Work' for k in kinds)\n"
        "assert results == [(True, True, total)] * p\n"
    )
    assert completion_asserted_after_wait(old_02) == [
        "line 7: assert results == [(True, True, total)] * p"
    ]
    fixed_02 = old_02.replace("x.tolist())", "x.tolist(), lk.device_backend())").replace(
        "assert results == [(True, True, total)] * p\n",
        "assert all(busy and values == total for _, busy, values, _ in results)\n"
        "if results[0][3] == 'gloo':\n"
        "    assert all(done for done, *_ in results)\n",
    )
    assert completion_asserted_after_wait(fixed_02) == []
    in_rank = "def f(rank, world_size):\n    w.wait()\n    assert w.is_completed()\n"
    assert completion_asserted_after_wait(in_rank) == ["line 3: assert w.is_completed()"]
    unpacked = (
        "def wait_vs_sync(rank, world_size):\n"
        "    wait_s, completed = time.perf_counter() - start, work.is_completed()\n"
        "    return lk.device_backend(), wait_s, completed\n"
        "timed = run(wait_vs_sync)[:2]\n"
        "for r, (_, wait_s, completed) in enumerate(timed):\n"
        "    assert wait_s > 0\n"
        "    assert completed\n"
    )
    assert completion_asserted_after_wait(unpacked) == ["line 7: assert completed"]


# -- host clocks around NCCL work: synchronise the device before reading them --------------

CLOCKS = ("time.perf_counter", "time.time", "time.monotonic")
SYNCS = ("sync_device", "torch.cuda.synchronize")


def _is_sync(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.If):  # `if dev.type == "cuda": torch.cuda.synchronize()`
        return bool(stmt.body) and all(map(_is_sync, stmt.body))
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Call)
        and ast.unparse(stmt.value.func).endswith(SYNCS)
    )


def unsynced_clock_reads(fn: ast.FunctionDef) -> list[str]:
    """Statements of ``fn`` that read a host clock without a device sync just before them: on
    a GPU the kernels queued before (NCCL's included) may still be running."""
    bad = []
    for node in ast.walk(fn):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if isinstance(stmt, (ast.If, ast.For, ast.While, ast.With, ast.Try)):
                    continue  # their own blocks are visited
                reads = any(
                    isinstance(n, ast.Call) and ast.unparse(n.func) in CLOCKS
                    for n in ast.walk(stmt)
                )
                if reads and not (i and _is_sync(block[i - 1])):
                    bad.append(f"{fn.name} line {stmt.lineno}: {ast.unparse(stmt)[:60]}")
    return bad


def test_05_reads_clocks_only_after_synchronising_the_device():
    """05's `causes()` (and any function 05 launches on the notebook's device) times NCCL work
    with host clocks: each read follows a device sync (`lk.trace.sync_device`)."""
    path = next(p for p in NOTEBOOKS if p.stem.startswith("05"))
    tree = parse(notebook_source(path))
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    launched = {fn for _, fn, kw in launches(tree) if fn in defs and may_be_cuda(kw)}
    assert "causes" in launched
    bad = [line for name in sorted(launched) for line in unsynced_clock_reads(defs[name])]
    assert not bad, f"{path.name}: call lk.trace.sync_device(dev) before these reads: {bad}"


def test_the_clock_scan_finds_an_unsynced_read():
    source = (
        "def causes(rank, world_size):\n"
        "    for _ in range(3):\n"
        "        lk.trace.sync_device(dev)\n"
        "        t0 = time.perf_counter()\n"
        "        for w in dist.batch_isend_irecv(ops):\n"
        "            w.wait()\n"
        "        both.append(time.perf_counter() - t0)\n"  # NCCL's wait() returned early
    )
    fn = parse(source).body[0]
    assert unsynced_clock_reads(fn) == ["causes line 7: both.append(time.perf_counter() - t0)"]
