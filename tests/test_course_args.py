"""``labkit course run``'s --device, --backend, --world-size and --param, checked before any
notebook runs; the launches each notebook resolved "auto" to; the machine table's GPU stack.

    .venv/bin/python -m pytest tests/test_course_args.py

CUDA is mocked (0 and 2 GPUs) where a flag needs it; ``run_course`` is replaced by a recorder,
so only the test marked ``slow`` starts a kernel (the fixture tests/notebooks/launches.ipynb).
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import types
from pathlib import Path

import pytest

import labkit.course as course
import labkit.course.args as course_args
import labkit.course.report as report
from labkit.cli import main
from labkit.course import course_parameters, parse_param
from labkit.launcher import launch_log

FIXTURES = Path(__file__).resolve().parent / "notebooks"


@pytest.fixture
def notebooks(tmp_path: Path) -> Path:
    folder = tmp_path / "notebooks"
    folder.mkdir()
    shutil.copy(FIXTURES / "ok.ipynb", folder / "00_ok.ipynb")
    return folder


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Replace run_course by a recorder: what reached it, and proof nothing else ran."""
    seen: list[dict] = []

    def fake_run_course(notebooks_dir, output_dir, **kwargs):
        seen.append({"output": output_dir, **kwargs})
        return []

    def no_notebook(*args, **kwargs):
        raise AssertionError("a notebook ran")

    monkeypatch.setattr(course, "run_course", fake_run_course)
    monkeypatch.setattr(course, "run_notebook", no_notebook)
    return seen


@pytest.fixture
def cli(notebooks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``cli(gpus, *flags)``: ``labkit course run`` with ``gpus`` CUDA GPUs mocked."""

    def run(gpus: int, *flags: str) -> tuple[int, str]:
        monkeypatch.setattr(course_args, "cuda_device_count", lambda: gpus)
        err = io.StringIO()
        out = tmp_path / "out"
        argv = ["course", "run", "--no-progress", "--notebooks", str(notebooks)]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            try:
                code = main([*argv, "--output", str(out), *flags])
            except SystemExit as exc:  # argparse's own refusals (--world-size) exit 2 this way
                code = exc.code
        return code, err.getvalue()

    return run


BAD = [
    (0, ["--device", "gpu"], "--device must be one of auto, cpu, cuda; got 'gpu'"),
    (0, ["--device", "cuda"], "--device cuda: no CUDA GPU is visible here"),
    (2, ["--device", "cuda", "--world-size", "4"], "--world-size 4 needs 4 GPUs, 2 visible"),
    (0, ["--backend", "nccl"], "--backend nccl: no CUDA GPU is visible here"),
    (2, ["--backend", "nccl", "--device", "cpu"], "NCCL moves CUDA tensors only"),
    (0, ["--world-size", "0"], "must be at least 1, got 0"),
    (0, ["--world-size", "two"], "must be a positive integer, got 'two'"),
    (0, ["--param", "seed"], "--param 'seed': expected key=value"),
    (0, ["--param", "2x=1"], "the key '2x' is not a Python identifier"),
    (0, ["--param", "lambda=1"], "the key 'lambda' is not a Python identifier"),
    (0, ["--param", "fast=False"], "fast has its own flag; use --fast"),
    (0, ["--param", "device=cpu"], "device has its own flag; use --device"),
    (0, ["--param", "backend=gloo"], "backend has its own flag; use --backend"),
    (0, ["--param", "world_size=2"], "world_size has its own flag; use --world-size"),
    (0, ["--param", "seed=1", "--param", "seed=2"], "--param seed= is given twice (1 and 2)"),
]


@pytest.mark.parametrize(("gpus", "flags", "message"), BAD, ids=[" ".join(b[1]) for b in BAD])
def test_bad_values_exit_2_before_any_notebook(
    cli, calls: list[dict], tmp_path: Path, gpus: int, flags: list[str], message: str
) -> None:
    code, stderr = cli(gpus, *flags)
    assert code == 2
    assert message in stderr
    assert calls == []
    assert not (tmp_path / "out").exists()


GOOD = [
    (0, ["--fast", "--device", "cpu", "--backend", "gloo"], {"fast": True, "device": "cpu",
                                                             "backend": "gloo"}),
    (2, ["--device", "cuda", "--backend", "nccl", "--world-size", "2"],
     {"device": "cuda", "backend": "nccl", "world_size": 2}),
    (2, ["--device", "auto", "--backend", "nccl"], {"device": "auto", "backend": "nccl"}),
    (0, ["--param", "seed=3", "--param", "model=gpt", "--param", "lr=1e-3",
         "--param", "sizes=[1, 2]", "--param", "note=a=b"],
     {"seed": 3, "model": "gpt", "lr": 1e-3, "sizes": [1, 2], "note": "a=b"}),
]  # fmt: skip


@pytest.mark.parametrize(("gpus", "flags", "expected"), GOOD, ids=[" ".join(g[1]) for g in GOOD])
def test_good_values_reach_run_course(
    cli, calls: list[dict], gpus: int, flags: list[str], expected: dict
) -> None:
    code, stderr = cli(gpus, *flags)
    assert code == 0, stderr
    assert len(calls) == 1
    assert calls[0]["parameters"] == expected
    assert type(calls[0]["parameters"].get("seed", 0)) is int


def test_gpu_count_is_asked_only_when_a_flag_needs_gpus() -> None:
    def boom() -> int:
        raise AssertionError("counted GPUs")

    assert course_parameters(device="cpu", backend="gloo", gpu_count=boom) == {
        "device": "cpu",
        "backend": "gloo",
    }
    assert course_parameters(device="cuda", gpu_count=lambda: 1) == {"device": "cuda"}


def test_parse_param_literal_else_string() -> None:
    assert parse_param("seed=3") == ("seed", 3)
    assert parse_param("flag=True") == ("flag", True)
    assert parse_param("name='x y'") == ("name", "x y")
    assert parse_param("name=x y") == ("name", "x y")
    assert parse_param("empty=") == ("empty", "")
    assert parse_param("none=None") == ("none", None)


def test_cuda_device_count_does_not_initialise_cuda() -> None:
    import torch

    course_args.cuda_device_count()
    assert not torch.cuda.is_initialized()


def test_launch_log_notes_each_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.launcher._checks import make_plan

    path = tmp_path / "launches.jsonl"
    monkeypatch.setenv(launch_log.LAUNCH_LOG_ENV, str(path))
    before = len(launch_log.launches())
    make_plan(2, "auto", "cpu", 30.0, False)
    make_plan(3, "gloo", "auto", 30.0, False)
    with pytest.raises((ValueError, RuntimeError)):
        make_plan(2, "nccl", "cpu", 30.0, False)  # refused: nothing to note
    expected = [launch_log.Launch("gloo", "cpu", 2), launch_log.Launch("gloo", "cpu", 3)]
    assert launch_log.read_launch_log(path) == expected
    assert launch_log.launches()[before:] == expected


def test_launch_log_without_env_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(launch_log.LAUNCH_LOG_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    assert launch_log.note_launch("nccl", "cuda:{rank}", 4) == launch_log.Launch("nccl", "cuda", 4)
    assert list(tmp_path.iterdir()) == []
    assert launch_log.read_launch_log(tmp_path / "missing.jsonl") == []


def test_launches_text() -> None:
    runs = [
        {"backend": "gloo", "device": "cpu", "world_size": 2},
        {"backend": "nccl", "device": "cuda", "world_size": 4},
        {"backend": "gloo", "device": "cpu", "world_size": 2},
    ]
    assert report.launches_text(runs) == "gloo/cpu ×2 (2 launches), nccl/cuda ×4"
    assert report.launches_text([]) == "no launch"


def _fake_torch(cuda: str | None, gpus: int, nccl: tuple | None) -> types.SimpleNamespace:
    def version() -> tuple:
        if nccl is None:
            raise RuntimeError("no NCCL in this build")
        return nccl

    return types.SimpleNamespace(
        version=types.SimpleNamespace(cuda=cuda),
        cuda=types.SimpleNamespace(
            device_count=lambda: gpus, nccl=types.SimpleNamespace(version=version)
        ),
    )


@pytest.mark.parametrize(
    ("cuda", "gpus", "nccl", "smi", "expected"),
    [
        (None, 0, (2, 27, 3), None, {"cuda_runtime": "none", "nvidia_driver": "none",
                                     "nccl": "none"}),
        ("12.8", 0, (2, 27, 3), None, {"cuda_runtime": "12.8", "nvidia_driver": "none",
                                       "nccl": "none"}),
        ("12.8", 2, (2, 27, 3), "570.124.06\n570.124.06\n",
         {"cuda_runtime": "12.8", "nvidia_driver": "570.124.06", "nccl": "2.27.3"}),
        ("12.8", 2, None, "570.124.06\n", {"cuda_runtime": "12.8",
                                           "nvidia_driver": "570.124.06", "nccl": "none"}),
    ],
    ids=["cpu-build", "cuda-build-no-gpu", "two-gpus", "no-nccl"],
)  # fmt: skip
def test_gpu_stack(
    monkeypatch: pytest.MonkeyPatch,
    cuda: str | None,
    gpus: int,
    nccl: tuple | None,
    smi: str | None,
    expected: dict,
) -> None:
    import subprocess
    import sys

    monkeypatch.setitem(sys.modules, "torch", _fake_torch(cuda, gpus, nccl))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no NVML fallback either
    monkeypatch.setattr(report.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if smi else None)

    def fake_run(cmd, **kwargs):
        assert cmd[1:] == ["--query-gpu=driver_version", "--format=csv,noheader"]
        return subprocess.CompletedProcess(cmd, 0, smi, "")

    monkeypatch.setattr(report.subprocess, "run", fake_run)
    assert report.gpu_stack() == expected


def test_machine_table_and_summary_show_the_stack_and_launches(tmp_path: Path) -> None:
    from labkit.course.readback import NotebookResult

    result = NotebookResult(
        name="00_ok.ipynb",
        path=tmp_path / "00_ok.ipynb",
        output_path=tmp_path / "out" / "00_ok.ipynb",
        status="ok",
        seconds=1.0,
        parameters={"backend": "auto"},
        launches=[{"backend": "nccl", "device": "cuda", "world_size": 2}],
    )
    machine = {"torch": "2.13.0", "cuda_runtime": "12.8", "nvidia_driver": "none", "nccl": "none"}
    page = course.write_report([result], tmp_path / "out", machine).read_text(encoding="utf-8")
    assert "<tr><th>cuda_runtime</th><td>12.8</td></tr>" in page
    assert "<tr><th>nvidia_driver</th><td>none</td></tr>" in page
    assert page.count("nccl/cuda ×2") == 2  # the notebooks table and the notebook's section
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["notebooks"][0]["launches"] == result.launches
    assert summary["machine"]["nccl"] == "none"


@pytest.mark.slow
def test_notebook_launches_are_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch_log.LAUNCH_LOG_ENV, raising=False)
    shutil.copy(FIXTURES / "launches.ipynb", tmp_path / "00_launches.ipynb")
    result = course.run_notebook(
        tmp_path / "00_launches.ipynb", tmp_path / "out", {"world_size": 2, "device": "cpu"}
    )
    assert result.ok, result.error
    assert result.parameters == {"world_size": 2, "device": "cpu"}
    assert result.launches == [{"backend": "gloo", "device": "cpu", "world_size": 2}]
    assert launch_log.LAUNCH_LOG_ENV not in __import__("os").environ  # restored


def test_machine_info_lists_gpus_without_initialising_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from labkit.preflight import gpu

    found = gpu.GpuQuery((gpu.Gpu("NVIDIA H200", 143771, 0),) * 2, "nvidia-smi")
    monkeypatch.setattr(gpu, "query_gpus", lambda: found)
    info = report.machine_info()
    assert info["gpus"] == ["NVIDIA H200 (140 GiB)"] * 2
    assert {"cuda_runtime", "nvidia_driver", "nccl"} <= set(info)
    assert not torch.cuda.is_initialized()
