"""Tests for labkit.preflight.gpu: GPUs (a fake nvidia-smi), NCCL and the CUDA state."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from labkit.preflight import gpu as gpu

SMI_ARGS = f"--query-gpu={gpu.SMI_FIELDS}"


def fake_nvidia_smi(folder: Path, body: str, query: str = SMI_ARGS) -> None:
    """Put an ``nvidia-smi`` script in ``folder`` that insists on the doctor's exact query."""
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = "{query}" ] && [ "$2" = "--format=csv,noheader" ] || '
        "{ echo 'Field \"compute_cap\" is not a valid field to query.'; exit 3; }\n" + body
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.fixture
def smi_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    return tmp_path


@pytest.fixture
def no_smi(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvidia-smi anywhere


@pytest.mark.parametrize("available, n_gpus, status", [(True, 2, "ok"), (False, 0, "ok"),
                                                       (False, 2, "warn")])  # fmt: skip
def test_nccl_never_fails(monkeypatch, available, n_gpus, status):
    monkeypatch.setattr(dist, "is_nccl_available", lambda: available)
    check = gpu.check_nccl(n_gpus)
    assert check.status == status
    assert bool(check.fix) == (status == "warn")


def test_parse_gpu_csv():
    text = "NVIDIA H100 80GB HBM3, 81559 MiB, 1 MiB\nTesla T4, 15360 MiB, 9000 MiB\n\n"
    assert gpu.parse_gpu_csv(text) == (
        gpu.Gpu("NVIDIA H100 80GB HBM3", 81559, 1),
        gpu.Gpu("Tesla T4", 15360, 9000),
    )
    with pytest.raises(ValueError):
        gpu.parse_gpu_csv("garbage")


def test_parse_gpu_csv_with_driver_and_compute_capability():
    text = (
        "NVIDIA H100 80GB HBM3, 81559 MiB, 1 MiB, 580.65.06, 9.0\nX, 1 MiB, 0 MiB, 580.65.06, [N/A]"
    )
    assert gpu.parse_gpu_csv(text, 5) == (
        gpu.Gpu("NVIDIA H100 80GB HBM3", 81559, 1, "580.65.06", (9, 0)),
        gpu.Gpu("X", 1, 0, "580.65.06", None),
    )
    assert gpu.parse_gpu_csv("Tesla T4, 15360 MiB, 0 MiB, 470.82.01", 4)[0].driver_version == (
        "470.82.01"
    )
    with pytest.raises(ValueError):
        gpu.parse_gpu_csv("Tesla T4, 15360 MiB, 0 MiB", 5)


def test_gpus_from_nvidia_smi(smi_dir, monkeypatch):
    fake_nvidia_smi(smi_dir, "echo 'NVIDIA H100 80GB HBM3, 81559 MiB, 1 MiB, 580.65.06, 9.0'\n" * 2)
    query = gpu.query_gpus()
    assert query.source == "nvidia-smi" and not query.error
    assert query.gpus == (gpu.Gpu("NVIDIA H100 80GB HBM3", 81559, 1, "580.65.06", (9, 0)),) * 2
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    check = gpu.check_gpus(query)
    assert check.status == "ok"
    assert check.detail.splitlines() == [
        "2 GPU(s) via nvidia-smi",
        "0: NVIDIA H100 80GB HBM3, 79.6 GiB (0.0 GiB in use)",
        "1: NVIDIA H100 80GB HBM3, 79.6 GiB (0.0 GiB in use)",
    ]


def test_an_old_nvidia_smi_without_compute_cap_still_lists_the_gpus(smi_dir):
    # Drivers before compute_cap existed reject the whole query: the doctor asks again without it.
    fake_nvidia_smi(smi_dir, "echo 'Tesla T4, 15360 MiB, 0 MiB, 470.82.01'\n",
                    f"--query-gpu={gpu.SMI_FIELDS_OLD}")  # fmt: skip
    query = gpu.query_gpus()
    assert not query.error
    assert query.gpus == (gpu.Gpu("Tesla T4", 15360, 0, "470.82.01", None),)


def test_busy_gpu_warns(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    gpus = (gpu.Gpu("Tesla T4", 15360, 0), gpu.Gpu("Tesla T4", 15360, 9000))
    check = gpu.check_gpus(gpu.GpuQuery(gpus, "nvidia-smi"))
    assert check.status == "warn"
    assert "GPU(s) 1 already" in check.fix


def test_failing_nvidia_smi_warns(smi_dir):
    fake_nvidia_smi(smi_dir, "echo 'NVIDIA-SMI has failed: no driver'; exit 9\n")
    query = gpu.query_gpus()
    assert query.gpus == ()
    assert "exited with 9: NVIDIA-SMI has failed" in query.error
    check = gpu.check_gpus(query)
    assert check.status == "warn" and "--gpus all" in check.fix


def test_no_nvidia_smi_and_cpu_torch_means_no_gpu(no_smi, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    query = gpu.query_gpus()
    assert query == gpu.GpuQuery((), "none")
    check = gpu.check_gpus(query)
    assert (check.status, check.detail) == ("ok", "no GPU: the course runs on CPU with gloo")


def test_no_nvidia_smi_asks_torch_in_a_subprocess(no_smi, monkeypatch):
    # Pretend this is a CUDA build: the doctor must ask a subprocess, never this process.
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    calls = []
    real_run = gpu._run
    monkeypatch.setattr(gpu, "_run", lambda cmd, timeout: calls.append(cmd) or real_run(cmd, 60))
    query = gpu.query_gpus()
    assert calls and calls[0][:2] == [sys.executable, "-c"]
    assert query.source == "torch subprocess" and not query.error
    assert query.gpus == tuple(gpu.parse_gpu_csv(""))  # the real torch here is a CPU build
    assert gpu.check_gpus(query).detail == gpu.NO_GPU


def test_cuda_state(monkeypatch):
    assert gpu.check_cuda_state().status == "ok"
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    check = gpu.check_cuda_state()
    assert check.status == "warn"
    assert "fork" in check.fix and "lk.launch is safe" in check.fix
