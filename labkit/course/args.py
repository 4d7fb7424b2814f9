"""Check ``labkit course run``'s parameters before any notebook runs.

Introduced in notebooks/00_setup_and_launcher.ipynb (``labkit course run`` in its summary).

    labkit course run --device cuda --backend nccl --world-size 2 --param seed=3

Every refusal is a ``ValueError`` whose message names the flag and the reason; the command
turns it into exit status 2, as it does for an unknown ``--only`` notebook.
"""

from __future__ import annotations

import ast
import keyword
from collections.abc import Callable, Sequence
from typing import Any

DEVICES = ("auto", "cpu", "cuda")
# Parameters that have a flag of their own: a --param may not set them behind its back.
DEDICATED_FLAGS = {
    "fast": "--fast",
    "device": "--device",
    "backend": "--backend",
    "world_size": "--world-size",
}


def cuda_device_count() -> int:
    """CUDA GPUs visible to this process, without initialising CUDA in it.

    ``torch.cuda.device_count()`` asks NVML first (it honours ``CUDA_VISIBLE_DEVICES`` and
    "will NOT poison fork if NVML discovery succeeds", says its docstring in torch 2.13), and
    is 0 on a CPU build; ``is_available()`` is not called, since it may initialise CUDA.

    Returns:
        The count; 0 when torch is not installed.
    """
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


def parse_param(text: str) -> tuple[str, Any]:
    """Split one ``--param key=value``; the value is a Python literal when it parses as one.

    Args:
        text: e.g. ``"seed=3"`` (-> ``("seed", 3)``) or ``"model=gpt"`` (-> ``("model", "gpt")``).

    Returns:
        The key and the value.

    Raises:
        ValueError: no ``=``, or a key that is not a Python identifier.
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep:
        raise ValueError(f"--param {text!r}: expected key=value, e.g. --param seed=3")
    if not key.isidentifier() or keyword.iskeyword(key):
        raise ValueError(f"--param {text!r}: the key {key!r} is not a Python identifier")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        value = raw  # not a literal: the text itself
    return key, value


def course_parameters(
    *,
    fast: bool = False,
    world_size: int | None = None,
    backend: str | None = None,
    device: str | None = None,
    params: Sequence[str] = (),
    gpu_count: Callable[[], int] | None = None,
) -> dict[str, Any]:
    """The parameters a course run offers every notebook, checked against this machine.

    Args:
        fast: offer ``fast=True``.
        world_size: ranks per launch; None leaves each notebook's default.
        backend: process-group backend; None leaves each notebook's default.
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``; None leaves each notebook's default.
        params: ``key=value`` texts from ``--param`` (see :func:`parse_param`).
        gpu_count: counts visible CUDA GPUs (None: :func:`cuda_device_count`); called only
            when a flag needs GPUs.

    Returns:
        The parameters dict, e.g. ``{"fast": True, "device": "cuda", "seed": 3}``.

    Raises:
        ValueError: a refused value; the message says which flag and why.
    """
    out: dict[str, Any] = {}
    if fast:
        out["fast"] = True
    if world_size is not None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"--world-size must be a positive integer, got {world_size!r}")
        out["world_size"] = world_size
    if device is not None:
        if device not in DEVICES:
            raise ValueError(f"--device must be one of {', '.join(DEVICES)}; got {device!r}")
        out["device"] = device
    if backend is not None:
        if backend.lower() == "nccl" and device == "cpu":
            raise ValueError(
                "--backend nccl with --device cpu: NCCL moves CUDA tensors only; "
                "use --device cuda (or auto), or --backend gloo for CPU"
            )
        out["backend"] = backend
    wants_gpu = device == "cuda" or (backend or "").lower() == "nccl"
    if wants_gpu:
        _check_gpus((gpu_count or cuda_device_count)(), device, backend, world_size)
    for text in params:
        key, value = parse_param(text)
        if key in DEDICATED_FLAGS:
            flag = DEDICATED_FLAGS[key]
            raise ValueError(f"--param {text!r}: {key} has its own flag; use {flag}")
        if key in out:
            raise ValueError(f"--param {key}= is given twice ({out[key]!r} and {value!r})")
        out[key] = value
    return out


def _check_gpus(gpus: int, device: str | None, backend: str | None, world_size: int | None):
    what = "--device cuda" if device == "cuda" else f"--backend {backend}"
    if gpus == 0:
        raise ValueError(
            f"{what}: no CUDA GPU is visible here (torch.cuda.device_count() is 0; "
            "check nvidia-smi and CUDA_VISIBLE_DEVICES); use --device cpu --backend gloo"
        )
    if world_size is not None and gpus < world_size:
        raise ValueError(
            f"{what} puts rank r on GPU r: --world-size {world_size} needs {world_size} GPUs, "
            f"{gpus} visible here"
        )
