"""Can torch use the GPUs that ``nvidia-smi`` lists? The doctor's "torch cuda" check.

Introduced in notebooks/00_setup_and_launcher.ipynb.

``nvidia-smi`` lists GPUs through the driver; torch needs more: a CUDA build, a driver new
enough for the CUDA it was built with, and kernels for each GPU's compute capability. The pinned
torch 2.13.0 Linux wheel from PyPI is a CUDA 13.0 build: it needs a 580-series driver and has no
kernels for Volta (7.0) and older. ``torch.cuda.is_available()`` initialises CUDA in the process
that calls it, and a notebook kernel that forks ranks must not have done that, so it is asked in
a ``python -c`` subprocess (:func:`probe_torch_cuda`); in this process only
``torch.version.cuda`` and ``torch.cuda.get_arch_list()`` are read (compile-time facts of the
build: in torch 2.13 the latter reads ``CUDA_ARCH_FLAGS`` without touching the driver).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass

from labkit.preflight.checks import Check
from labkit.preflight.gpu import GpuQuery

# NVIDIA, CUDA Compatibility, "Minor Version Compatibility", Table 1: a CUDA X.y build runs on
# any driver of at least this branch (with a limited feature set below the toolkit's own).
MIN_DRIVER_FOR_MAJOR = {11: (450,), 12: (525,), 13: (580,)}
# NVIDIA, CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding Driver Versions"
# (Linux x86_64, GA releases): the driver each toolkit ships with and fully supports.
TOOLKIT_DRIVER = {"12.6": "560.28.03", "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06"}
# Integrated GPUs (Jetson: 5.3, 6.2, 7.2, 8.7, Thor 10.1) run only code built for themselves;
# CUDA 13 renamed Thor 10.1 to 11.0. Source: torch/cuda/__init__.py, DEVICE_REQUIREMENT.
IGPU_CCS = {(5, 3), (6, 2), (7, 2), (8, 7), (10, 1)}
# torch 2.13's CUDA 12.6 x86_64 release build: torch.cuda.PYTORCH_RELEASES_CODE_CC["12.6"].
CU126_CODE_CC = ((5, 0), (6, 0), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0))
PROBE_TIMEOUT_S = 60.0
CUDA_WHEELS = "https://download.pytorch.org/whl"

# Prints one JSON line; runs in a child so that this process never initialises CUDA.
_PROBE = (
    "import json, warnings\n"
    "import torch\n"
    "with warnings.catch_warnings(record=True) as caught:\n"
    "    warnings.simplefilter('always')\n"
    "    available = torch.cuda.is_available()\n"
    "    count = torch.cuda.device_count() if available else 0\n"
    "    caps = [list(torch.cuda.get_device_capability(i)) for i in range(count)]\n"
    "print(json.dumps({'available': available, 'device_count': count, 'capabilities': caps,\n"
    "    'arch_list': torch.cuda.get_arch_list(), 'warnings': [str(w.message) for w in caught]}))\n"
)


@dataclass(frozen=True)
class TorchCuda:
    """What torch says in a subprocess: ``torch.cuda.is_available()`` and what it sees.

    Attributes:
        available: ``torch.cuda.is_available()``; None when the probe did not answer.
        device_count: GPUs torch sees (after ``CUDA_VISIBLE_DEVICES``).
        capabilities: ``(major, minor)`` per visible GPU.
        arch_list: ``torch.cuda.get_arch_list()``, e.g. ``("sm_75", ..., "sm_120")``.
        warnings: what torch warned while initialising CUDA (its reason, when it gives one).
        error: why the probe failed, if it did.
    """

    available: bool | None
    device_count: int = 0
    capabilities: tuple[tuple[int, int], ...] = ()
    arch_list: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True)
class Verdict:
    """The "torch cuda" check and how many GPUs NCCL may use (one rank per GPU)."""

    check: Check
    usable_gpus: int


def version_tuple(text: str) -> tuple[int, ...]:
    """``"580.65.06"`` → ``(580, 65, 6)``; the leading numeric fields only, ``()`` if none."""
    return tuple(int(part) for part in re.findall(r"\d+", text.split()[0] if text else ""))


def driver_problem(driver: str, cuda: str) -> str:
    """Why a driver cannot run a CUDA build, or ``""`` when it can (or is unknown).

    Args:
        driver: ``nvidia-smi``'s ``driver_version``, e.g. ``"570.124.06"``.
        cuda: ``torch.version.cuda``, e.g. ``"13.0"``.

    Returns:
        A sentence naming the driver the build needs, or ``""``.
    """
    have, want = version_tuple(driver), version_tuple(cuda)
    if not have or not want or want[0] not in MIN_DRIVER_FOR_MAJOR:
        return ""
    floor = MIN_DRIVER_FOR_MAJOR[want[0]]
    if have >= floor:
        return ""
    need = TOOLKIT_DRIVER.get(".".join(map(str, want[:2])), str(floor[0]))
    return (
        f"driver {driver} is older than torch's CUDA {cuda} needs: CUDA {want[0]}.x runs on "
        f"drivers >= {floor[0]} (minor version compatibility), CUDA {cuda} ships with {need}"
    )


def code_runs_on(code: str, cc: tuple[int, int]) -> bool:
    """Whether code compiled for ``code`` (``sm_86``, ``sm_90a``, ``compute_120``) runs on cc.

    CUDA C++ Programming Guide, "Binary Compatibility": a cubin for X.y runs on X.z, z >= y;
    ``a`` (arch-specific) code only on X.y itself; PTX (``compute_XY``) is JIT-compiled for any
    later capability. Integrated GPUs only run code built for them (:data:`IGPU_CCS`).
    """
    match = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", code)
    if match is None:
        return False
    kind, major, minor, suffix = match.group(1), int(match.group(2)), int(match.group(3)), match[4]
    built = (major, minor)
    if built == (10, 1) and cc == (11, 0):
        return True  # Thor: sm_101 in CUDA 12 is sm_110 in CUDA 13
    if cc in IGPU_CCS or built in IGPU_CCS:
        return cc == built
    if suffix == "a":
        return cc == built
    if kind == "compute" and not suffix:
        return cc >= built
    return cc[0] == major and cc[1] >= minor


def probe_torch_cuda(timeout: float = PROBE_TIMEOUT_S) -> TorchCuda:
    """Ask ``torch.cuda.is_available()`` and what torch sees, in a ``python -c`` subprocess.

    Args:
        timeout: seconds to wait for it (importing torch and initialising CUDA).

    Returns:
        A :class:`TorchCuda`; ``available`` is None and ``error`` set when it did not answer.
    """
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        data = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return TorchCuda(None, error=f"the torch subprocess did not answer: {exc}")
    return TorchCuda(
        bool(data["available"]),
        int(data["device_count"]),
        tuple((int(a), int(b)) for a, b in data["capabilities"]),
        tuple(data["arch_list"]),
        tuple(data["warnings"]),
    )


def _build() -> tuple[str | None, str | None, tuple[str, ...]]:
    try:
        import torch
    except ImportError:
        return None, None, ()
    # get_arch_list reads the compile-time CUDA_ARCH_FLAGS: no CUDA initialisation.
    hip = getattr(torch.version, "hip", None)
    return torch.version.cuda, hip, tuple(torch.cuda.get_arch_list())


def _pin() -> str:
    from labkit.preflight.checks import torch_pin

    return torch_pin()[0]


def assess_torch_cuda(query: GpuQuery, probe: TorchCuda | None = None) -> Verdict:
    """Say whether torch can use the GPUs listed, and if not, why and what to do.

    Args:
        query: the GPUs found by :func:`labkit.preflight.gpu.query_gpus`.
        probe: torch's answer; asked with :func:`probe_torch_cuda` when GPUs are listed and
            torch is a CUDA build (never in this process).

    Returns:
        A :class:`Verdict`: "ok" with the GPUs torch uses, or "warn" naming the cause (a CPU
        build, an old driver, an unsupported compute capability, or torch's own reason).
    """
    gpus = query.gpus
    if not gpus:
        return Verdict(Check("torch cuda", "ok", "no GPU listed: torch runs on CPU"), 0)
    cuda, hip, arch = _build()
    n = len(gpus)
    if cuda is None and hip is None:
        return Verdict(_cpu_build(n), 0)
    if probe is None:
        probe = probe_torch_cuda()
    driver = gpus[0].driver_version
    old_driver = driver_problem(driver, cuda) if cuda else ""
    arch = probe.arch_list or arch
    build = f"CUDA {cuda}" if cuda else f"ROCm {hip}"
    seen = f"{n} GPU(s) listed by {query.source}; torch {build}, driver {driver or '?'}"
    if probe.available is False or (probe.available is None and old_driver):
        cause = old_driver or _visible_devices_problem() or " ".join(probe.warnings).strip()
        detail = f"{seen}\ntorch.cuda.is_available() is False: {cause or 'torch gave no reason'}"
        if probe.available is None:
            detail = f"{seen}\n{probe.error}; predicted from the driver: {old_driver}"
        return Verdict(Check("torch cuda", "warn", detail, _fix(old_driver, cause)), 0)
    caps = [g.compute_cap for g in gpus] if all(g.compute_cap for g in gpus) else []
    caps = caps or list(probe.capabilities)
    bad = [i for i, cc in enumerate(caps) if arch and not any(code_runs_on(a, cc) for a in arch)]
    if cuda and bad:
        listed = ", ".join(f"{i}: {gpus[i].name} ({caps[i][0]}.{caps[i][1]})" for i in bad)
        good = [str(i) for i in range(len(caps)) if i not in bad]
        detail = f"{seen}\nno kernels for GPU(s) {listed}; torch is built for {' '.join(arch)}"
        if all(any(code_runs_on(f"sm_{a}{b}", caps[i]) for a, b in CU126_CODE_CC) for i in bad):
            fix = (
                f"install the CUDA 12.6 build, which has kernels for them (on x86_64: 5.0 to 9.0): "
                f"`pip install torch=={_pin()} --index-url {CUDA_WHEELS}/cu126`"
            )
        else:
            fix = "no x86_64 CUDA build of torch 2.13 has kernels for them: run the course on CPU"
        if good:
            fix += f"; or use only the others: CUDA_VISIBLE_DEVICES={','.join(good)}"
        return Verdict(Check("torch cuda", "warn", detail, fix), len(good))
    if probe.available is None:
        detail = f"{seen}\n{probe.error}"
        fix = f"run `{sys.executable} -c 'import torch; print(torch.cuda.is_available())'`"
        return Verdict(Check("torch cuda", "warn", detail, fix), 0)
    detail = f"{seen}\ntorch.cuda.is_available() is True; torch sees {probe.device_count} GPU(s)"
    if arch:
        detail += f", built for {' '.join(arch)}"
    return Verdict(Check("torch cuda", "ok", detail), probe.device_count)


def _cpu_build(n: int) -> Check:
    pin = _pin()
    return Check(
        "torch cuda",
        "warn",
        f"{n} GPU(s) listed, but torch is a CPU build (torch.version.cuda is None): "
        "torch.cuda.is_available() is False",
        f"install a CUDA build: on Linux `pip install torch=={pin}` from PyPI is the CUDA 13.0 "
        f"build (driver >= 580); for older drivers use `--index-url {CUDA_WHEELS}/cu126`. "
        "CPU with gloo works meanwhile",
    )


def _visible_devices_problem() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not visible.strip():
        return "CUDA_VISIBLE_DEVICES is set and empty: it hides every GPU from torch"
    return ""


def _fix(old_driver: str, cause: str) -> str:
    if old_driver:
        return (
            "upgrade the NVIDIA driver (to the 580 series or newer for the CUDA 13.0 wheel), or "
            "install a torch build for the CUDA your driver supports (`nvidia-smi` prints it as "
            f"'CUDA Version'), e.g. `--index-url {CUDA_WHEELS}/cu126` for drivers >= 525"
        )
    if "CUDA_VISIBLE_DEVICES" in cause:
        return "unset CUDA_VISIBLE_DEVICES, or list the GPUs to use: CUDA_VISIBLE_DEVICES=0,1"
    return (
        "read torch's reason above; `nvidia-smi` should list the GPUs and the driver; in Docker "
        "run with `--gpus all`. CPU with gloo works meanwhile"
    )
