"""labkit's backends pass PyTorch's own distributed tests (``tests/dist_suite.py``).

Backends introduced in notebooks/04_custom_backend.ipynb.

Each backend runs the suite's CPU tests of what it claims — ``labkit_shm``: collectives, p2p
and DDP; ``labkit_record`` and ``labkit_simnet``, wrapping gloo: the same, transparently;
``labkit_cpp``: the four collectives it implements — in a fresh interpreter per backend and
world size (the suite reads its backend at import), and is compared with gloo on the same
selection: every test gloo passes must pass. Tests the suite gates on the literal name
``"gloo"`` are run a second time with ``LABKIT_SUITE_AS_GLOO=1`` (``tests/dist_suite.py``
says how), for the tests gloo passes and the backend's own run skipped.

Two sizes of the same check:

- ``test_ci_selection``: a few tests per backend, with 2 ranks (and 4 for labkit_shm) —
  the regression cases among them; part of a plain ``pytest``.
- ``test_full_selection``: the whole selection, 2 and 4 ranks, marked ``torch_suite``; it
  skips itself unless ``-m torch_suite`` selects it (an ``addopts`` default would be
  overridden by any other ``-m``, such as ``make test-quick``'s). The full run::

      PYTHONPATH=. python -m pytest -m torch_suite tests/test_torch_suite.py -v

  writes each run's counts to ``$LABKIT_SUITE_OUT`` (default: pytest's tmp dir).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import pytest

from labkit.backends import cpp_build

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

# The suite's CPU tests of collectives, p2p and DDP (its CUDA-, NCCL- and GPU-only tests
# exit at once on a CPU machine and are left out so the run stays short).
SELECTION = (
    "(broadcast or reduce or gather or scatter or all_to_all or barrier or send_recv or isend"
    " or irecv or batch_isend_irecv or ddp or accumulate_gradients or coalescing_manager)"
    " and not cuda and not nccl and not gpu"
)
# labkit_cpp implements all_reduce (every ReduceOp), broadcast, all_gather and barrier.
CPP_SELECTION = (
    "(test_all_reduce or test_broadcast or test_all_gather or test_barrier)"
    " and not coalesced and not cuda and not nccl and not complex and not object"
)
# Features torch documents as gloo's alone, which no labkit backend claims: monitored_barrier
# (torch.distributed.monitored_barrier raises "monitored_barrier is only implemented for GLOO
# backend." for any other backend name, wrappers of gloo included) and sparse all_reduce (the
# suite: "Only Gloo backend supports sparse all reduce"; labkit_shm refuses sparse tensors).
GLOO_ONLY_FEATURES = ("monitored_barrier", "sparse")
BACKENDS = ("labkit_shm", "labkit_record", "labkit_simnet", "labkit_cpp")
# A CI selection: the three regressions (all_gather_coalesced, a collective on tensors that
# require grad under DDP, send/recv followed by exit) and one test per kind of operation.
CI_TESTS = (
    "test_all_gather_coalesced_simple",
    "test_ddp_create_graph",
    "test_send_recv",
    "test_isend",
    "test_all_reduce_sum",
    "test_broadcast",
    "test_all_gather",
    "test_barrier",
    "test_barrier_timeout_global",  # expects c10d's "Timed out"
    "test_reduce_sum",
    "test_scatter",
    "test_batch_isend_irecv_gloo",
)
CPP_CI_TESTS = ("test_all_reduce_sum", "test_broadcast", "test_all_gather", "test_barrier")


def _run_suite(
    backend: str, world_size: int, k: str, out: Path, as_gloo: bool = False, start: str = ""
) -> dict:
    """Run the suite once; return {test name: "passed" | "failed" | "skipped"} and counts."""
    tag = f"{backend}-{world_size}{'-as-gloo' if as_gloo else ''}{f'-{start}' if start else ''}"
    xml = out / f"{tag}.xml"
    env = {
        **os.environ,
        "LABKIT_SUITE_BACKEND": backend,
        "WORLD_SIZE": str(world_size),
        "LABKIT_SUITE_AS_GLOO": "1" if as_gloo else "0",
        "LABKIT_SUITE_START": start or "forkserver",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
    cmd += [str(HERE / "dist_suite.py"), "-k", k, f"--junitxml={xml}"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if not xml.exists():
        raise AssertionError(f"the suite did not run ({tag}):\n{proc.stdout[-3000:]}")
    outcomes: dict[str, str] = {}
    for case in ET.parse(xml).iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = "passed"
        if kinds & {"failure", "error"}:
            outcome = "failed"
        elif "skipped" in kinds:
            outcome = "skipped"
        outcomes[case.get("name")] = outcome
    counts = {o: sum(v == o for v in outcomes.values()) for o in ("passed", "failed", "skipped")}
    report = {"run": tag, "k": k, "counts": counts, "outcomes": outcomes}
    (out / f"{tag}.json").write_text(json.dumps(report, indent=1))
    report["log"] = proc.stdout[-6000:]
    return report


def _failed(report: dict) -> list[str]:
    return sorted(n for n, o in report["outcomes"].items() if o == "failed")


def _skip_cpp(backend: str) -> None:
    if backend == "labkit_cpp" and not cpp_build.available():
        pytest.skip("labkit_cpp needs a C++ compiler")


def _ci_params():
    for backend in BACKENDS:
        yield pytest.param(backend, 2, id=f"{backend}-2")
    yield pytest.param("labkit_shm", 4, id="labkit_shm-4")


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "world_size"), list(_ci_params()))
def test_ci_selection(backend, world_size, tmp_path):
    _skip_cpp(backend)
    names = CPP_CI_TESTS if backend == "labkit_cpp" else CI_TESTS
    k = " or ".join(names)
    k = f"({k}) and not profiler and not _async and not _group and not complex and not cuda"
    if backend == "labkit_cpp":
        k += " and not coalesced"  # labkit_cpp has no coalesced collectives
    as_gloo = backend != "labkit_cpp"  # these names include gloo-gated tests
    report = _run_suite(backend, world_size, k, tmp_path, as_gloo=as_gloo)
    assert not _failed(report), f"{_failed(report)}\n{report['log']}"
    passed = {n for n, o in report["outcomes"].items() if o == "passed"}
    assert set(names) <= passed, f"did not pass: {sorted(set(names) - passed)}\n{report['log']}"


@cache
def _out_dir() -> Path:
    out = Path(os.environ.get("LABKIT_SUITE_OUT", "") or "/tmp/labkit-torch-suite")
    out.mkdir(parents=True, exist_ok=True)
    return out


@cache
def _gloo(world_size: int, k: str) -> dict:
    return _run_suite("gloo", world_size, k, _out_dir())


def _full_params():
    for world_size in (2, 4):
        for backend in BACKENDS:
            yield pytest.param(backend, world_size, id=f"{backend}-{world_size}")


@pytest.mark.torch_suite
@pytest.mark.timeout(3600)
@pytest.mark.parametrize(("backend", "world_size"), list(_full_params()))
def test_full_selection(backend, world_size, request):
    markexpr = request.config.getoption("markexpr") or ""
    if "torch_suite" not in markexpr or "not torch_suite" in markexpr:
        pytest.skip("the full run (~15 min): pytest -m torch_suite tests/test_torch_suite.py")
    _skip_cpp(backend)
    k = CPP_SELECTION if backend == "labkit_cpp" else SELECTION
    gloo = _gloo(world_size, k)
    assert not _failed(gloo), f"gloo itself failed {_failed(gloo)}"
    ours = _run_suite(backend, world_size, k, _out_dir())
    gloo_passed = {n for n, o in gloo["outcomes"].items() if o == "passed"}
    # Tests gloo passes that the backend's own run skipped: the suite's gates on the name.
    gated = sorted(n for n in gloo_passed if ours["outcomes"].get(n) == "skipped")
    outcomes = dict(ours["outcomes"])
    if gated:
        as_gloo = _run_suite(backend, world_size, " or ".join(gated), _out_dir(), as_gloo=True)
        for n in gated:
            outcomes[n] = as_gloo["outcomes"].get(n, "missing")
    gloo_only = sorted(n for n in gloo_passed if any(f in n for f in GLOO_ONLY_FEATURES))
    missing = sorted(n for n in gloo_passed if outcomes.get(n) != "passed" and n not in gloo_only)
    summary = {
        "gloo": gloo["counts"],
        backend: ours["counts"],
        "gated_on_gloo_rerun": len(gated),
        "gloo_only_features_not_claimed": {n: outcomes.get(n) for n in gloo_only},
        "gloo_passes_we_do_not": missing,
    }
    (_out_dir() / f"summary-{backend}-{world_size}.json").write_text(json.dumps(summary))
    assert not _failed(ours), f"{_failed(ours)}\n{ours['log']}"
    assert not missing, f"gloo passes, {backend} does not: {missing}"
