"""The doctor's checks of the software: Python, torch against the pin, torch.distributed, gloo.

Introduced in notebooks/00_setup_and_launcher.ipynb.

Each check is a small function returning a :class:`Check`. The GPU checks are in
:mod:`labkit.preflight.gpu` (whether torch can use the GPUs: :mod:`labkit.preflight.torch_cuda`),
the host checks (cores, memory, ``/dev/shm``, network, packages) in
:mod:`labkit.preflight.host`, leftover labkit processes in :mod:`labkit.preflight.stale`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

STATUSES = ("ok", "warn", "fail")
SUPPORTED_PYTHON = ((3, 10), (3, 13))  # inclusive range of minor versions
FALLBACK_TORCH_PIN = "2.13.0"  # used when requirements.txt is not next to the package
REQUIREMENTS = Path(__file__).resolve().parents[2] / "requirements.txt"


@dataclass
class Check:
    """One line of the doctor's report.

    Attributes:
        name: what was checked, e.g. ``"gloo"``.
        status: ``"ok"``, ``"warn"`` (works, but worth fixing) or ``"fail"`` (blocks the course).
        detail: the measured fact, e.g. ``"3.11.7 at /home/me/.venv/bin/python"``.
        fix: what to do when the status is not ok (empty when ok).
        seconds: how long the check took.
    """

    name: str
    status: str
    detail: str
    fix: str = ""
    seconds: float = field(default=0.0, compare=False)

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")


def check_python(version: tuple[int, ...] | None = None, executable: str | None = None) -> Check:
    """Check the Python version (3.10–3.13 supported) and report the interpreter in use.

    The range is ``requires-python`` in pyproject.toml.

    Args:
        version: ``sys.version_info`` by default (a parameter so tests can pass another).
        executable: ``sys.executable`` by default.

    Returns:
        "ok" inside the supported range, else "fail".
    """
    version = tuple(version or sys.version_info)
    executable = executable or sys.executable or "unknown interpreter"
    text = ".".join(str(v) for v in version[:3])
    detail = f"{text} at {executable}"
    low, high = SUPPORTED_PYTHON
    if low <= version[:2] <= high:
        return Check("python", "ok", detail)
    return Check(
        "python",
        "fail",
        detail,
        f"use Python {low[0]}.{low[1]}–{high[0]}.{high[1]}: e.g. `python3.12 -m venv .venv && "
        "make setup`, or `conda env create -f environment.yml`",
    )


def torch_pin(requirements: Path = REQUIREMENTS) -> tuple[str, str]:
    """The course's torch version and where it came from (``requirements.txt`` or a constant).

    Args:
        requirements: the pins file at the repository root (present in an editable install).

    Returns:
        ``(version, source)``, e.g. ``("2.13.0", "requirements.txt")``.
    """
    try:
        text = requirements.read_text()
    except OSError:
        return FALLBACK_TORCH_PIN, "labkit's default"
    match = re.search(r"^\s*torch\s*==\s*([^\s;#]+)", text, re.MULTILINE)
    if match is None:
        return FALLBACK_TORCH_PIN, "labkit's default"
    return match.group(1), requirements.name


def check_torch(pin: tuple[str, str] | None = None) -> Check:
    """Compare the installed torch with the course pin; warn on a mismatch.

    Args:
        pin: ``(version, source)``; :func:`torch_pin` by default.

    Returns:
        "ok" when the versions match, "warn" when they differ, "fail" without torch.
    """
    version, source = pin or torch_pin()
    try:
        import torch
    except ImportError as exc:
        return Check(
            "torch", "fail", f"cannot import torch: {exc}", f"pip install torch=={version}"
        )
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU"
    if getattr(torch.version, "hip", None):
        build = f"ROCm {torch.version.hip}"
    detail = f"{torch.__version__} ({build} build), course pin {version} from {source}"
    if torch.__version__.split("+")[0] == version:
        return Check("torch", "ok", detail)
    return Check(
        "torch",
        "warn",
        detail,
        f"the notebooks are tested with torch {version}: `pip install torch=={version}` "
        "(or `pip install -r requirements.txt`)",
    )


def check_distributed() -> Check:
    """Check that this torch build has ``torch.distributed``.

    Returns:
        "ok" when ``torch.distributed.is_available()``, else "fail".
    """
    try:
        import torch.distributed as dist
    except ImportError as exc:
        return Check("torch.distributed", "fail", f"cannot import: {exc}", "pip install torch")
    if dist.is_available():
        return Check("torch.distributed", "ok", "available")
    return Check(
        "torch.distributed",
        "fail",
        "this torch build has no distributed support",
        "install the official torch wheel (`pip install -r requirements.txt`); some "
        "platform builds leave torch.distributed out",
    )


def check_gloo() -> Check:
    """Check the gloo backend, which every notebook uses on CPU.

    Returns:
        "ok" when ``torch.distributed.is_gloo_available()``, else "fail".
    """
    try:
        import torch.distributed as dist

        available = dist.is_available() and dist.is_gloo_available()
    except ImportError:
        available = False
    if available:
        return Check("gloo", "ok", "available (the CPU backend of every notebook)")
    return Check(
        "gloo",
        "fail",
        "not available in this torch build",
        "install the official torch wheel: `pip install -r requirements.txt`",
    )
