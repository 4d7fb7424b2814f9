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
import json
from pathlib import Path

import pytest

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
    tree = ast.parse(notebook_source(path))
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
        for node in ast.walk(ast.parse(text)):
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
        tree = ast.parse(path.read_text())
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
    tree = ast.parse(
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
