"""Tests for labkit/launcher/_gpus.py: GPUs counted through NVML, never by initialising CUDA in
the process that launches ranks (``torch.cuda`` mocked; this machine has a CPU build)."""

from __future__ import annotations

import pytest
import torch

from labkit.launcher import _gpus
from labkit.preflight.torch_cuda import TorchCuda


def _forbidden(*args, **kwargs):
    raise AssertionError("initialises CUDA in the launching process")


@pytest.fixture
def cuda_build(monkeypatch) -> None:
    """A CUDA build whose CUDA runtime must not be touched; CUDA not initialised yet."""
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", _forbidden)
    monkeypatch.setattr(torch.cuda, "device_count", _forbidden)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(_gpus, "probe_torch_cuda", _forbidden)
    _gpus._probe_in_subprocess.cache_clear()


def test_a_cpu_build_counts_zero_without_initialising_cuda() -> None:
    assert _gpus.gpu_count() == (torch.cuda.device_count() if torch.version.cuda else 0)
    assert not torch.cuda.is_initialized()


@pytest.mark.parametrize("n", [0, 1, 8])
def test_nvml_answers_and_torch_confirms_in_a_subprocess(cuda_build, monkeypatch, n) -> None:
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: n)
    probes = []
    monkeypatch.setattr(_gpus, "probe_torch_cuda", lambda: probes.append(1) or TorchCuda(True, n))
    assert _gpus.gpu_count() == n
    assert _gpus.gpu_count() == n
    assert len(probes) == (1 if n else 0)  # no GPU listed: nothing to ask; else asked once


def test_listed_gpus_torch_cannot_use_do_not_count(cuda_build, monkeypatch, capsys) -> None:
    """A 535 driver lists the GPUs to NVML; torch's CUDA 13 build cannot use them."""
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: 2)
    monkeypatch.setattr(_gpus, "probe_torch_cuda", lambda: TorchCuda(False, 0))
    monkeypatch.setattr(_gpus, "_said", set())
    assert _gpus.gpu_count() == 0
    assert "the driver lists 2 GPU(s) but torch can use 0" in capsys.readouterr().err


def test_a_cpu_build_asks_nothing(cuda_build, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: False)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", _forbidden)
    assert _gpus.gpu_count() == 0


def test_once_cuda_is_initialised_here_torch_counts(cuda_build, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", _forbidden)
    assert _gpus.gpu_count() == 3


@pytest.mark.parametrize(
    ("probe", "expected"),
    [
        (TorchCuda(True, 2), 2),
        (TorchCuda(False, 0, warnings=("driver too old",)), 0),
        (TorchCuda(None, error="the torch subprocess did not answer: timed out"), 0),
    ],
)
def test_without_nvml_a_subprocess_asks_torch(cuda_build, monkeypatch, probe, expected) -> None:
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", lambda: -1)  # NVML failed
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", f"case-{expected}-{probe.available}")
    probes = []
    monkeypatch.setattr(_gpus, "probe_torch_cuda", lambda: probes.append(1) or probe)
    assert _gpus.gpu_count() == expected
    assert _gpus.gpu_count() == expected  # cached for the same CUDA_VISIBLE_DEVICES
    assert len(probes) == 1


def test_rocm_goes_to_the_subprocess(cuda_build, monkeypatch) -> None:
    monkeypatch.setattr(torch.version, "hip", "6.2")
    monkeypatch.setattr(torch.cuda, "_device_count_nvml", _forbidden)
    monkeypatch.setattr(_gpus, "probe_torch_cuda", lambda: TorchCuda(True, 4))
    assert _gpus.gpu_count() == 4


def test_the_real_probe_answers_from_another_process() -> None:
    if torch.version.cuda:
        pytest.skip("a CUDA build: the count depends on this machine's GPUs")
    assert _gpus._probe_in_subprocess.__wrapped__(None) == 0  # a CPU build sees no GPU
    assert not torch.cuda.is_initialized()
