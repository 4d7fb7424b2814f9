"""Every notebook and test is written to the device rule (labkit/launcher/device_rule.py).

The rule makes CPU tensors safe under ``backend="auto"`` (on GPUs the group is
``"cpu:gloo,cuda:nccl"``), so what can still break on a GPU machine is code that hands the
notebook's own ``backend`` parameter — which a GPU user sets to ``"nccl"``, a group with no CPU
path — to ranks that make CPU tensors, and code that asks the backend's name where it means
"are my tensors on a GPU". These checks read the sources (no GPU needed) and name the file,
the function and the line to fix.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from pathlib import Path

import pytest

from tests.ast_parse import parse

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
FACTORIES = {
    "arange", "empty", "eye", "full", "linspace", "ones", "rand", "randint", "randn", "tensor",
    "zeros",
}  # fmt: skip


def notebook_source(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    code = ("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    keep = (line for cell in code for line in cell.splitlines())
    return "\n".join(line for line in keep if not line.lstrip().startswith(("%", "!")))


def launches(tree: ast.AST):
    """``(call, function name or None, keyword sources)`` of every ``*.launch(...)`` call."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr == "launch" and node.args:
                fn = node.args[0].id if isinstance(node.args[0], ast.Name) else None
                yield node, fn, {k.arg: ast.unparse(k.value) for k in node.keywords}


def may_be_cuda(kw: dict[str, str]) -> bool:
    """A launch that hands on the notebook's backend, or a device that is not the CPU."""
    device = kw.get("device", "").strip("'\"")
    return kw.get("backend") == "backend" or device not in ("", "cpu")


def moved_on(fn: ast.AST) -> set[int]:
    """ids of the nodes in ``fn`` whose value goes straight into ``.to(...)``."""
    return {
        id(n.func.value)
        for n in ast.walk(fn)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "to"
    }


def host_tensors(fn: ast.FunctionDef) -> list[str]:
    """Tensor factories in ``fn`` with no ``device=`` and not moved on by ``.to(...)``."""
    moved = moved_on(fn)
    found = []
    for n in ast.walk(fn):
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in FACTORIES
            and ast.unparse(n.func.value) == "torch"
            and not any(k.arg == "device" for k in n.keywords)
            and id(n) not in moved
        ):
            found.append(f"line {n.lineno}: {ast.unparse(n)[:70]}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_ranks_given_the_notebooks_backend_put_tensors_on_their_device(path):
    """A rank that may be on CUDA (the notebook's backend or device) makes no bare CPU tensor."""
    tree = parse(notebook_source(path))
    defs = {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    targets = {fn for _, fn, kw in launches(tree) if fn and may_be_cuda(kw)}
    for name in list(targets):  # and the notebook's functions they call (unless moved on)
        fn = defs.get(name, ast.Module(body=[], type_ignores=[]))
        for n in ast.walk(fn):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in defs:
                if id(n) not in moved_on(fn):
                    targets.add(n.func.id)
    bad = {name: host_tensors(defs[name]) for name in sorted(targets) if name in defs}
    bad = {name: lines for name, lines in bad.items() if lines}
    assert not bad, (
        f"{path.name}: these functions run with backend=backend (NCCL on GPUs) but make CPU "
        f"tensors; pass device=lk.get_device() or launch them on a CPU backend: {bad}"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_notebook_parameters_are_fitted_to_the_machine(path):
    """The cell after the parameters calls lk.fit_ranks, so `--device cuda` on 1 GPU runs."""
    cells = json.loads(path.read_text())["cells"]
    at = next(
        i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])
    )
    params = "".join(cells[at]["source"])
    assert "world_size" in params and "backend" in params and "device" in params
    first = "".join(cells[at + 1]["source"])
    # A notebook with GPU-only sections first keeps the device as asked (lk.section_gpus).
    first = re.sub(r"\Agpu_device = device(  #[^\n]*)?\n", "", first)
    assert first.startswith("world_size, backend, device = lk.fit_ranks(world_size, backend, "), (
        f"{path.name}: cell {at + 1} should start by fitting world_size/backend/device"
    )


def python_sources():
    for path in sorted((ROOT / "labkit").rglob("*.py")):
        yield path, path.read_text()
    for path in NOTEBOOKS:
        yield path, notebook_source(path)


def test_nobody_asks_the_backends_name_to_learn_the_device():
    """Under "cpu:gloo,cuda:nccl" `get_backend() == "nccl"` is False on GPUs: use the device."""
    allowed = {("labkit/bench_results.py", "dist.get_backend() == 'nccl'")}  # pure NCCL only
    found = []
    for path, text in python_sources():
        for node in ast.walk(parse(text)):
            left = ast.unparse(node.left) if isinstance(node, ast.Compare) else ""
            if left.startswith(("dist.get_backend(", "get_backend(")):
                if any(isinstance(c, ast.Constant) and c.value == "nccl" for c in node.comparators):
                    where = (str(path.relative_to(ROOT)), ast.unparse(node))
                    if where not in allowed:
                        found.append(where)
    assert not found, f"compare lk.get_device().type or lk.device_backend() instead: {found}"


def test_tests_that_launch_on_nccl_or_cuda_are_gpu_tests():
    """A test that asks for NCCL or CUDA ranks must skip without GPUs (marked `gpu`)."""
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = parse(path.read_text())
        for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
            marks = " ".join(ast.unparse(d) for d in fn.decorator_list)
            if "pytest.raises" in ast.unparse(fn):
                continue  # a test that the launch is refused
            for _, _, kw in launches(fn):
                wants = kw.get("backend", "").strip("'\"") == "nccl" or (
                    kw.get("device", "").strip("'\"") == "cuda"
                )
                if wants and "gpu" not in marks and "cuda" not in marks:
                    found.append(f"{path.name}::{fn.name}")
    assert not found, f"mark these @pytest.mark.gpu (they need one GPU per rank): {found}"


def test_the_scan_finds_what_it_is_for():
    """The check above on a planted example: a bare CPU tensor found, moved ones not."""
    tree = parse(
        "def bad(rank, world_size):\n"
        "    x = torch.zeros(3)\n"
        "    y = torch.ones(3, device=lk.get_device())\n"
        "    z = torch.randn(3, generator=g).to(lk.get_device())\n"
        "lk.launch(bad, 2, backend=backend, device=device)\n"
    )
    ((call, fn, kw),) = launches(tree)
    assert fn == "bad" and may_be_cuda(kw)
    assert not may_be_cuda({"backend": "reference", "device": "'cpu'"})
    fn_def = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    assert host_tensors(fn_def) == ["line 2: torch.zeros(3)"]


# -- world sizes handed the notebook's backend and device -----------------------------------

SAFE_BUILTINS = {"abs": abs, "len": len, "list": list, "max": max, "min": min, "range": range,
                 "set": set, "sorted": sorted}  # fmt: skip
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)


def module_level(tree: ast.AST):
    """Every node of ``tree`` outside function and class bodies (notebook-level code)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, SCOPES))


def bindings(tree: ast.AST) -> dict[str, list[tuple[str, ast.expr]]]:
    """Notebook-level ``x = expr`` as ``("=", expr)`` and ``for x in it`` as ``("in", it)``."""
    found: dict[str, list[tuple[str, ast.expr]]] = {}
    for node in module_level(tree):
        pairs = []
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(target, ast.Name):
                pairs = [(target, "=", value)]
            elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
                pairs = [(t, "=", v) for t, v in zip(target.elts, value.elts, strict=False)]
        elif isinstance(node, ast.For) and isinstance(node.target, ast.Name):
            pairs = [(node.target, "in", node.iter)]
        for target, kind, value in pairs:
            if isinstance(target, ast.Name):
                found.setdefault(target.id, []).append((kind, value))
    return found


def possible_values(expr: ast.expr, world: int, binds, depth: int = 0) -> set | None:
    """Every value ``expr`` can take when the fitted world size is ``world``; None: unknown."""
    names = sorted({n.id for n in ast.walk(expr) if isinstance(n, ast.Name)} - set(SAFE_BUILTINS))
    options = []
    for name in names:
        if name == "world_size":
            options.append([world])
            continue
        if name not in binds or depth > 5:
            return None
        values = set()
        for kind, value in binds[name]:
            got = possible_values(value, world, binds, depth + 1)
            if got is None:
                return None
            values |= {x for v in got for x in v} if kind == "in" else got
        options.append(sorted(values, key=repr))
    code = compile(ast.Expression(expr), "<world size>", "eval")
    out = set()
    for combo in itertools.product(*options):
        value = eval(code, {"__builtins__": SAFE_BUILTINS}, dict(zip(names, combo, strict=True)))
        out.add(tuple(value) if isinstance(value, (list, set)) else value)
    return out


def fitted_worlds(tree: ast.AST) -> list[int]:
    """The world sizes the notebook's own ``lk.fit_ranks`` call can return (up to 16 ranks)."""
    for node in module_level(tree):
        if (
            isinstance(node, ast.Assign)
            and ast.unparse(node.targets[0]) == "(world_size, backend, device)"
            and ast.unparse(node.value).startswith("lk.fit_ranks(")
        ):
            kw = {k.arg: k.value for k in node.value.keywords}
            least = kw["at_least"].value if "at_least" in kw else 1
            step = kw["multiple_of"].value if "multiple_of" in kw else 1
            return [w for w in range(least, 17) if w % step == 0]
    raise AssertionError("no lk.fit_ranks call")


def unfitted_launches(tree: ast.AST) -> list[str]:
    """Launches that hand on the notebook's own ``backend``/``device`` with a world the fit
    did not cover: with ``device="cuda"`` and GPUs for the lesson's world only, they fail."""
    binds, worlds, bad = bindings(tree), fitted_worlds(tree), []
    for call, _, kw in launches(tree):
        if kw.get("backend") != "backend" and kw.get("device") != "device":
            continue  # its own backend/device (a CPU one, or one fitted to this world)
        sizes = [*call.args[1:2], *(k.value for k in call.keywords if k.arg == "world_size")]
        ws = sizes[0] if sizes else ast.Constant(4)  # lk.launch's default world_size
        for world in worlds:
            values = possible_values(ws, world, binds)
            if values is None or max(values) > world:
                bad.append(f"line {call.lineno}: {ast.unparse(call)[:70]} (world {world})")
                break
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_launches_on_the_notebooks_device_stay_within_the_fitted_world(path):
    """More ranks than fit_ranks fitted, on the notebook's device: fit that world too."""
    bad = unfitted_launches(parse(notebook_source(path)))
    assert not bad, (
        f"{path.name}: these launches pass backend=backend/device=device with more ranks than "
        "lk.fit_ranks fitted (or a world size the scan cannot bound): fit their world with "
        f"`_, on_backend, on_device = lk.fit_ranks(ranks, backend, device)`: {bad}"
    )


def test_the_world_scan_finds_an_unfitted_launch():
    """03's ring check before the fix: 3 ranks on the notebook's device when p = 2."""
    fit = "world_size, backend, device = lk.fit_ranks(world_size, backend, device, at_least=2)\n"
    bad = fit + (
        "p = world_size\n"
        "for ranks in sorted({2, 3, p}):\n"
        "    lk.launch(f, ranks, backend=backend, device=device)\n"
    )
    assert unfitted_launches(parse(bad)) == [
        "line 4: lk.launch(f, ranks, backend=backend, device=device) (world 2)"
    ]
    fixed = fit + (
        "p = world_size\n"
        "for ranks in sorted({2, 3, p}):\n"
        "    _, on_backend, on_device = lk.fit_ranks(ranks, backend, device)\n"
        "    lk.launch(f, ranks, backend=on_backend, device=on_device)\n"
        "q = 1 << (p.bit_length() - 1)\n"
        "lk.launch(f, q, backend=backend, device=device)\n"
        "lk.launch(f, max(2, p - p % 2), backend=backend, device=device)\n"
    )
    assert unfitted_launches(parse(fixed)) == []


# -- tests that expect what "auto" gives on this machine ------------------------------------


def auto_launches(fn: ast.FunctionDef) -> list[ast.Call]:
    """``launch(...)`` / ``World(...)`` calls in ``fn`` that leave backend and device to "auto"."""
    found = []
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func).rsplit(".", 1)[-1]
        if name not in ("launch", "World"):
            continue
        kw = {k.arg: ast.unparse(k.value).strip("'\"") for k in node.keywords}
        backend_at = 2 if name == "launch" else 1  # launch(fn, ws, backend), World(ws, backend)
        if len(node.args) > backend_at:
            kw.setdefault("backend", ast.unparse(node.args[backend_at]).strip("'\""))
        if kw.get("backend", "auto") == "auto" and kw.get("device", "auto") == "auto":
            found.append(node)
    return found


def cpu_assumptions(source: str) -> list[str]:
    """Tests that launch under "auto" and then assert a literal "gloo" or "cpu": on a machine
    with a GPU per rank "auto" gives "cpu:gloo,cuda:nccl" on cuda:r, and they fail there."""
    found = []
    for fn in ast.walk(parse(source)):
        if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test_"):
            continue
        marks = " ".join(ast.unparse(d) for d in fn.decorator_list)
        if "gpu" in marks or "device_count" in marks or "cuda" in marks:
            continue  # a GPU test, or one skipped where there are GPUs
        if "gpus" in {a.arg for a in fn.args.args}:
            continue  # GPU counts mocked by the `gpus` fixture (tests/test_device_rule.py)
        if not auto_launches(fn):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Assert) and any(
                isinstance(c, ast.Constant) and c.value in ("gloo", "cpu") for c in ast.walk(node)
            ):
                found.append(f"{fn.name} line {node.lineno}")
    return found


def test_tests_do_not_assume_auto_means_the_cpu():
    found = [
        f"{path.name}::{hit}"
        for path in sorted((ROOT / "tests").glob("test_*.py"))
        for hit in cpu_assumptions(path.read_text())
    ]
    assert not found, (
        'these tests launch with backend/device "auto" and assert "gloo"/"cpu", which fails on '
        'a machine with a GPU per rank: pass device="cpu" where the test is about the CPU, or '
        f"expect lk.launch_choice(world_size): {found}"
    )


def test_the_auto_scan_finds_a_cpu_assumption():
    bad = (
        "def test_a():\n"
        "    assert lk.launch(where, 2) == [('cpu', 'gloo')] * 2\n"
        "def test_b():\n"
        "    assert lk.launch(where, 2, device='cpu') == [('cpu', 'gloo')] * 2\n"
        "@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason='GPUs')\n"
        "def test_c():\n"
        "    assert lk.launch(where, 2) == ['cpu', 'cpu']\n"
        "def test_d():\n"
        "    w = lk.World(2)\n"
        "    assert w.backend == 'gloo'\n"
    )
    assert cpu_assumptions(bad) == ["test_a line 2", "test_d line 10"]


# -- GPU-only sections follow the device parameter; CPU labs say they run on the CPU --------


def gpu_uses(tree: ast.AST) -> list[tuple[ast.Call, ast.AST]]:
    """Notebook-level code that puts work on a GPU by itself (not through ``device``):
    ``(call, the node that names the GPU)``."""
    found = []
    for node in module_level(tree):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        if func.startswith("torch.cuda.") and func.split(".")[-1] not in (
            "device_count",
            "is_available",
        ):
            found.append((node, node))
        elif isinstance(node.func, ast.Attribute) and node.func.attr == "cuda":
            found.append((node, node))
        else:  # device="cuda:0", backend="nccl", torch.device("cuda", i), x.to("cuda")
            named = [k.value for k in node.keywords if k.arg in ("device", "backend")]
            if func == "torch.device" or func.endswith(".to"):
                named += node.args
            found += [
                (node, c)
                for arg in named
                for c in ast.walk(arg)
                if isinstance(c, ast.Constant) and str(c.value).startswith(("cuda", "nccl"))
            ]
    return found


def section_names(tree: ast.AST) -> set[str]:
    """Names bound (at notebook level) from ``lk.section_gpus(...)``, directly or through them."""
    binds, names = bindings(tree), set()
    while True:
        more = {
            name
            for name, values in binds.items()
            for _, value in values
            if any(
                ast.unparse(n).endswith("section_gpus") or getattr(n, "id", None) in names
                for n in ast.walk(value)
            )
        }
        if more <= names:
            return names
        names |= more


def unguarded_gpu_uses(source: str) -> list[str]:
    tree = parse(source)
    parents = {id(c): p for p in ast.walk(tree) for c in ast.iter_child_nodes(p)}
    guards, bad = section_names(tree), []
    for use, node in gpu_uses(tree):
        guarded = False
        while id(node) in parents and not guarded:
            node = parents[id(node)]
            if isinstance(node, (ast.If, ast.IfExp, ast.While)):
                guarded = any(getattr(n, "id", None) in guards for n in ast.walk(node.test))
        line = f"line {use.lineno}: {ast.unparse(use)[:70]}"
        if not guarded and line not in bad:
            bad.append(line)
    for node in module_level(tree):  # a decision from torch.cuda alone ignores `device`
        if isinstance(node, (ast.If, ast.IfExp)):
            test = ast.unparse(node.test)
            if re.search(r"torch\.cuda\.(device_count|is_available)", test) and not re.search(
                r"\b(gpu_)?device\b", test
            ):
                bad.append(f"line {node.lineno}: decides from `{test[:60]}` alone")
    return bad


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_gpu_sections_follow_the_device_parameter(path):
    """`course run --device cpu` keeps every cell off the GPUs: GPU-only code runs under a
    guard on ``lk.section_gpus(gpu_device, ...)``, which is 0 under device="cpu"."""
    bad = unguarded_gpu_uses(notebook_source(path))
    assert not bad, (
        f"{path.name}: GPU work that does not ask lk.section_gpus(gpu_device, need, what) "
        f"first (it says why it skips): {bad}"
    )


def test_the_gpu_section_scan_finds_a_section_that_ignores_device():
    bad = (
        "n_gpus = torch.cuda.device_count()\n"
        "if n_gpus >= 2:\n"
        "    lk.launch(f, n_gpus, backend='nccl', device='cuda')\n"
    )
    assert unguarded_gpu_uses(bad) == [
        "line 3: lk.launch(f, n_gpus, backend='nccl', device='cuda')",
    ]
    assert unguarded_gpu_uses("if torch.cuda.is_available():\n    pass\n") == [
        "line 1: decides from `torch.cuda.is_available()` alone"
    ]
    good = (
        "n_gpus = lk.section_gpus(gpu_device, need=2, what='x')\n"
        "nd = min(p, n_gpus)\n"
        "if nd >= 2:\n"
        "    lk.launch(f, nd, backend='nccl', device='cuda')\n"
        "    xb = torch.randn(8, device='cuda:0')\n"
    )
    assert unguarded_gpu_uses(good) == []


# Notebooks allowed to spell the CPU-lab choice inline (none: every lab goes through lk.cpu_lab).
INLINE_CPU_LABS: set[str] = set()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem[:2])
def test_cpu_labs_say_so_through_cpu_lab(path):
    """A lab on CPU tensors by design takes its backend from lk.cpu_lab, which says it runs on
    the CPU whenever GPUs could have been expected ("auto" on a GPU machine included)."""
    if path.stem[:2] in INLINE_CPU_LABS:
        pytest.skip("reworked on another branch")
    inline = [
        f"line {n.lineno}: {ast.unparse(n)[:70]}"
        for n in ast.walk(parse(notebook_source(path)))
        if isinstance(n, ast.IfExp)
        and isinstance(n.body, ast.Constant)
        and n.body.value == "gloo"
        and "backend" in ast.unparse(n.test)
    ]
    assert not inline, f"{path.name}: use lk.cpu_lab(backend, device, what=...): {inline}"
