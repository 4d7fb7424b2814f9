"""Tests for labkit.preflight.torch_cuda: can torch use the GPUs nvidia-smi lists, and why not.

nvidia-smi's answer (a :class:`GpuQuery`) and torch's attributes are mocked; the subprocess probe
is replaced by a :class:`TorchCuda` so no case needs a GPU.
"""

from __future__ import annotations

import pytest
import torch

from labkit.preflight import host as host
from labkit.preflight import torch_cuda as tc
from labkit.preflight.gpu import Gpu, GpuQuery

# torch 2.13's CUDA 13.0 x86_64 build (torch.cuda.PYTORCH_RELEASES_CODE_CC["13.0"], checked below).
CU130_ARCH = ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120")
H100 = Gpu("NVIDIA H100 80GB HBM3", 81559, 1, "580.65.06", (9, 0))
V100 = Gpu("Tesla V100-SXM2-32GB", 32768, 0, "580.65.06", (7, 0))


def smi(*gpus: Gpu) -> GpuQuery:
    return GpuQuery(tuple(gpus), "nvidia-smi")


def seen(n: int, arch: tuple[str, ...] = CU130_ARCH) -> tc.TorchCuda:
    return tc.TorchCuda(True, n, ((9, 0),) * n, arch)


@pytest.fixture
def cuda_build(monkeypatch):
    """torch looks like the CUDA 13.0 wheel; get_arch_list as that wheel's."""
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: list(CU130_ARCH))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def test_no_gpu_listed_is_ok_and_asks_nothing(monkeypatch):
    monkeypatch.setattr(tc, "probe_torch_cuda", lambda: pytest.fail("probed without GPUs"))
    verdict = tc.assess_torch_cuda(GpuQuery((), "none"))
    assert (verdict.check.status, verdict.usable_gpus) == ("ok", 0)
    assert verdict.check.detail == "no GPU listed: torch runs on CPU"


@pytest.mark.parametrize("n", [1, 2, 8])
def test_gpus_torch_can_use(cuda_build, n):
    verdict = tc.assess_torch_cuda(smi(*[H100] * n), seen(n))
    assert (verdict.check.status, verdict.usable_gpus) == ("ok", n)
    assert verdict.check.detail.splitlines() == [
        f"{n} GPU(s) listed by nvidia-smi; torch CUDA 13.0, driver 580.65.06",
        f"torch.cuda.is_available() is True; torch sees {n} GPU(s), built for "
        + " ".join(CU130_ARCH),
    ]


def test_cpu_build_beside_gpus(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(tc, "probe_torch_cuda", lambda: pytest.fail("a CPU build needs no probe"))
    verdict = tc.assess_torch_cuda(smi(H100, H100))
    check = verdict.check
    assert (check.status, verdict.usable_gpus) == ("warn", 0)
    assert check.detail == (
        "2 GPU(s) listed, but torch is a CPU build (torch.version.cuda is None): "
        "torch.cuda.is_available() is False"
    )
    assert "`pip install torch==2.13.0` from PyPI is the CUDA 13.0 build (driver >= 580)" in (
        check.fix
    )


def test_old_driver_for_the_cuda_13_wheel(cuda_build):
    old = Gpu("NVIDIA A100-SXM4-80GB", 81920, 0, "570.124.06", (8, 0))
    probe = tc.TorchCuda(False, warnings=("CUDA initialization: The NVIDIA driver on your "
                                          "system is too old (found version 12080)",))  # fmt: skip
    verdict = tc.assess_torch_cuda(smi(old, old), probe)
    check = verdict.check
    assert (check.status, verdict.usable_gpus) == ("warn", 0)
    assert check.detail.splitlines()[1] == (
        "torch.cuda.is_available() is False: driver 570.124.06 is older than torch's CUDA 13.0 "
        "needs: CUDA 13.x runs on drivers >= 580 (minor version compatibility), CUDA 13.0 ships "
        "with 580.65.06"
    )
    assert check.fix.startswith("upgrade the NVIDIA driver (to the 580 series or newer")
    assert "download.pytorch.org/whl/cu126` for drivers >= 525" in check.fix


def test_old_driver_predicted_when_the_probe_fails(cuda_build):
    old = Gpu("Tesla T4", 15360, 0, "535.183.01", (7, 5))
    probe = tc.TorchCuda(None, error="the torch subprocess did not answer: timed out")
    check = tc.assess_torch_cuda(smi(old), probe).check
    assert check.status == "warn"
    assert "timed out; predicted from the driver: driver 535.183.01 is older" in check.detail


@pytest.mark.parametrize(
    "driver, cuda, problem",
    [
        ("580.65.06", "13.0", ""),
        ("575.57.08", "13.0", "CUDA 13.x runs on drivers >= 580"),
        ("535.104.05", "12.8", ""),  # below 570.26, but 12.x minor version compatibility holds
        ("520.61.05", "12.8", "CUDA 12.8 ships with 570.26"),
        ("", "13.0", ""),  # unknown driver: no claim
    ],
)
def test_driver_table(driver, cuda, problem):
    found = tc.driver_problem(driver, cuda)
    assert (problem in found) if problem else found == ""
    assert bool(found) == bool(problem)


def test_unsupported_compute_capability(cuda_build):
    verdict = tc.assess_torch_cuda(smi(V100, V100), seen(2))
    check = verdict.check
    assert (check.status, verdict.usable_gpus) == ("warn", 0)
    assert check.detail.splitlines()[1] == (
        "no kernels for GPU(s) 0: Tesla V100-SXM2-32GB (7.0), 1: Tesla V100-SXM2-32GB (7.0); "
        "torch is built for " + " ".join(CU130_ARCH)
    )
    assert check.fix.startswith("install the CUDA 12.6 build, which has kernels for them")
    assert "`pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu126`" in (
        check.fix
    )
    assert "CUDA_VISIBLE_DEVICES" not in check.fix


def test_a_gpu_no_build_supports(cuda_build):
    k80 = Gpu("Tesla K80", 11441, 0, "580.65.06", (3, 7))
    check = tc.assess_torch_cuda(smi(k80), seen(1)).check
    assert check.status == "warn"
    assert (
        check.fix
        == "no x86_64 CUDA build of torch 2.13 has kernels for them: run the course on CPU"
    )


def test_the_pinned_wheels_tables_are_torchs_own():
    # The CUDA 13.0 wheel has no Volta kernels; the CUDA 12.6 build does (torch 2.13's table).
    releases = torch.cuda.PYTORCH_RELEASES_CODE_CC
    assert {f"sm_{cc}" for cc in releases["13.0"]["x86_64"]} == set(CU130_ARCH)
    assert {a * 10 + b for a, b in tc.CU126_CODE_CC} == releases["12.6"]["x86_64"]
    assert not any(tc.code_runs_on(code, (7, 0)) for code in CU130_ARCH)
    assert tc.code_runs_on("sm_75", (7, 5))


def test_one_unsupported_gpu_of_two_leaves_one(cuda_build):
    verdict = tc.assess_torch_cuda(smi(V100, H100), seen(2))
    assert (verdict.check.status, verdict.usable_gpus) == ("warn", 1)
    assert verdict.check.fix.endswith("or use only the others: CUDA_VISIBLE_DEVICES=1")


def test_empty_cuda_visible_devices_is_named(cuda_build, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    check = tc.assess_torch_cuda(smi(H100), tc.TorchCuda(False)).check
    assert check.status == "warn"
    assert "CUDA_VISIBLE_DEVICES is set and empty" in check.detail
    assert check.fix.startswith("unset CUDA_VISIBLE_DEVICES")


def test_unavailable_without_a_known_cause_shows_torch_reason(cuda_build):
    probe = tc.TorchCuda(False, warnings=("CUDA initialization: no CUDA-capable device",))
    check = tc.assess_torch_cuda(smi(H100), probe).check
    assert check.detail.endswith("is False: CUDA initialization: no CUDA-capable device")
    assert "--gpus all" in check.fix


@pytest.mark.parametrize(
    "code, cc, runs",
    [
        ("sm_80", (8, 6), True),
        ("sm_86", (8, 0), False),
        ("sm_90a", (9, 0), True),
        ("sm_90a", (10, 0), False),
        ("compute_90", (12, 0), True),  # PTX JIT-compiles forward
        ("sm_90", (12, 0), False),
        ("sm_80", (8, 7), False),  # Orin (iGPU) runs only its own code
        ("sm_101", (11, 0), True),  # Thor renamed in CUDA 13
    ],
)
def test_code_runs_on(code, cc, runs):
    assert tc.code_runs_on(code, cc) is runs


def test_code_runs_on_agrees_with_torchs_table():
    # torch 2.13's own rule (what torch.cuda warns about at init), for every code cc it knows.
    table = torch.cuda.DEVICE_REQUIREMENT
    ccs = sorted(table) + [111, 121]
    for code in table:
        for device in ccs:
            cc = (device // 10, device % 10)
            assert tc.code_runs_on(f"sm_{code}", cc) is (device in table[code]), (code, device)


@pytest.mark.parametrize(
    "n_gpus, advice",
    [
        (0, "world_size 4 suits this machine on CPU"),
        (1, "under backend='nccl' a notebook's world_size may be at most 1;"),
        (2, "under backend='nccl' a notebook's world_size may be at most 2;"),
        (8, "under backend='nccl' a notebook's world_size may be at most 8;"),
    ],
)
def test_world_size_advice_follows_the_usable_gpus(monkeypatch, n_gpus, advice):
    monkeypatch.setattr(host, "usable_cores", lambda: (16, "16 cores"))
    detail = host.check_cpu(n_gpus).detail
    assert advice in detail
    assert ("runs with backend='gloo' on CPU (backend='auto' picks it then)" in detail) is (
        n_gpus > 0
    )
    assert f"world_size={n_gpus}" not in detail  # no advice to set world_size to the GPU count


def test_the_real_probe_answers_from_a_subprocess():
    # This machine's torch is the CPU build: the child says False and sees nothing.
    probe = tc.probe_torch_cuda()
    assert probe == tc.TorchCuda(torch.cuda.is_available(), 0, (), (), ())
    assert not torch.cuda.is_initialized()


def test_a_probe_that_does_not_answer(monkeypatch):
    monkeypatch.setattr(tc.sys, "executable", "/nonexistent/python")
    probe = tc.probe_torch_cuda()
    assert probe.available is None and "did not answer" in probe.error
