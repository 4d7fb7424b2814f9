"""The doctor's GPU checks: the GPUs present, NCCL, and whether CUDA is initialised here.

Introduced in notebooks/00_setup_and_launcher.ipynb.

None of them initialises CUDA in this process (learners run the doctor inside their notebook
kernel, and a kernel with CUDA initialised cannot fork safely): GPUs are read with
``nvidia-smi`` or, without it, from a short ``python -c`` subprocess that asks torch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from labkit.preflight.checks import Check

NO_GPU = "no GPU: the course runs on CPU with gloo"
BUSY_GPU_FRACTION = 0.25  # more memory in use than this on an idle box: someone holds the GPU

# nvidia-smi --help-query-gpu; older drivers lack compute_cap, so the doctor retries without it.
SMI_FIELDS = "name,memory.total,memory.used,driver_version,compute_cap"
SMI_FIELDS_OLD = "name,memory.total,memory.used,driver_version"
# Same CSV as `nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader`.
_TORCH_GPU_QUERY = (
    "import torch\n"
    "for i in range(torch.cuda.device_count()):\n"
    "    free, total = torch.cuda.mem_get_info(i)\n"
    "    name = torch.cuda.get_device_properties(i).name\n"
    "    print(f'{name}, {total >> 20} MiB, {(total - free) >> 20} MiB')\n"
)


@dataclass(frozen=True)
class Gpu:
    """One GPU as ``nvidia-smi`` (or torch in a subprocess) reports it; memory in MiB.

    ``driver_version`` (e.g. ``"580.65.06"``) and ``compute_cap`` (e.g. ``(9, 0)``) are empty /
    None where the source does not report them (torch, or an ``nvidia-smi`` without
    ``compute_cap``).
    """

    name: str
    memory_total_mib: int
    memory_used_mib: int
    driver_version: str = ""
    compute_cap: tuple[int, int] | None = None


@dataclass(frozen=True)
class GpuQuery:
    """The GPUs found, how they were found, and what went wrong (``error``) if anything."""

    gpus: tuple[Gpu, ...]
    source: str  # "nvidia-smi", "torch subprocess" or "none"
    error: str = ""


def check_nccl(n_gpus: int) -> Check:
    """Check the NCCL backend; only a warning, and only where there are GPUs to use it.

    Args:
        n_gpus: GPUs found on the machine.

    Returns:
        "ok", or "warn" when GPUs are present but this torch build has no NCCL.
    """
    try:
        import torch.distributed as dist

        available = dist.is_available() and dist.is_nccl_available()
    except ImportError:
        available = False
    if available:
        return Check("nccl", "ok", "available")
    if n_gpus == 0:
        return Check("nccl", "ok", "not in this torch build; not needed without GPUs")
    return Check(
        "nccl",
        "warn",
        f"not in this torch build, but {n_gpus} GPU(s) are present",
        "install a CUDA build of torch to run the notebooks with backend='nccl'",
    )


def parse_gpu_csv(text: str, fields: int = 3) -> tuple[Gpu, ...]:
    """Parse ``name, 81559 MiB, 1 MiB[, 580.65.06[, 9.0]]`` lines (CSV without header).

    Args:
        text: the command's stdout.
        fields: columns per line: 3 (name and memory), 4 (+ driver), 5 (+ compute capability).

    Returns:
        One :class:`Gpu` per non-empty line.

    Raises:
        ValueError: a line does not have that shape.
    """
    gpus = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        parts = [part.strip() for part in line.rsplit(",", fields - 1)]
        if len(parts) != fields:
            raise ValueError(f"expected {fields} fields: {line!r}")
        name, total, used, *rest = parts + [""] * (5 - fields)
        major, _, minor = rest[1].partition(".")  # "9.0"; "[N/A]" or "" when unknown
        cap = (int(major), int(minor)) if major.isdigit() and minor.isdigit() else None
        gpus.append(Gpu(name, int(total.split()[0]), int(used.split()[0]), rest[0], cap))
    return tuple(gpus)


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def query_gpus() -> GpuQuery:
    """Find the GPUs without initialising CUDA in this process.

    Uses ``nvidia-smi`` when it is on PATH; otherwise, if torch is a CUDA or ROCm build, a
    short ``python -c`` subprocess asks torch. A CPU build of torch without ``nvidia-smi``
    means no usable GPU, with no subprocess at all. Fields as in ``nvidia-smi
    --help-query-gpu``; memory is in MiB.

    Returns:
        A :class:`GpuQuery`; ``error`` says why the query failed, if it did.
    """
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        query = GpuQuery((), "nvidia-smi")
        for fields in (SMI_FIELDS, SMI_FIELDS_OLD):  # a driver without compute_cap: retry
            cmd = [smi, f"--query-gpu={fields}", "--format=csv,noheader"]
            retry = _ask(cmd, "nvidia-smi", 10.0, fields.count(",") + 1)
            query = query if query.error and retry.error else retry
            if not query.error:
                break
        return query
    try:
        import torch

        gpu_build = bool(torch.version.cuda or getattr(torch.version, "hip", None))
    except ImportError:
        gpu_build = False
    if not gpu_build:
        return GpuQuery((), "none")
    return _ask([sys.executable, "-c", _TORCH_GPU_QUERY], "torch subprocess", 60.0, 3)


def _ask(cmd: list[str], source: str, timeout: float, fields: int) -> GpuQuery:
    try:
        done = _run(cmd, timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuQuery((), source, f"{source} did not answer: {exc}")
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        return GpuQuery((), source, f"{source} exited with {done.returncode}: {last[0]}")
    try:
        return GpuQuery(parse_gpu_csv(done.stdout, fields), source)
    except ValueError:
        return GpuQuery((), source, f"unexpected {source} output: {done.stdout[:200]!r}")


def check_gpus(query: GpuQuery) -> Check:
    """Report the GPUs: count, names and memory (found by :func:`query_gpus`).

    Args:
        query: the result of :func:`query_gpus`.

    Returns:
        "ok" (GPUs, or none: CPU is fine), "warn" when the query failed or a GPU is mostly
        full already. Whether torch can use them is the "torch cuda" check
        (:mod:`labkit.preflight.torch_cuda`).
    """
    if query.error:
        return Check(
            "gpus",
            "warn",
            query.error,
            "check the NVIDIA driver (`nvidia-smi` should list the GPUs); inside Docker, run "
            "with `--gpus all`. Without GPUs the course runs on CPU with gloo",
        )
    if not query.gpus:
        return Check("gpus", "ok", NO_GPU)
    lines = [
        f"{i}: {g.name}, {g.memory_total_mib / 1024:.1f} GiB "
        f"({g.memory_used_mib / 1024:.1f} GiB in use)"
        for i, g in enumerate(query.gpus)
    ]
    detail = f"{len(query.gpus)} GPU(s) via {query.source}\n" + "\n".join(lines)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        detail += f"\nCUDA_VISIBLE_DEVICES={visible} (torch sees only these)"
    busy = [
        str(i)
        for i, g in enumerate(query.gpus)
        if g.memory_used_mib > BUSY_GPU_FRACTION * max(g.memory_total_mib, 1)
    ]
    if busy:
        return Check(
            "gpus",
            "warn",
            detail,
            f"GPU(s) {', '.join(busy)} already have memory in use: `nvidia-smi` lists the "
            "processes holding it (a stale rank? see 'stale processes')",
        )
    return Check("gpus", "ok", detail)


def check_cuda_state() -> Check:
    """Warn when CUDA is already initialised in this process (read, never triggered).

    Source: PyTorch docs, "Multiprocessing best practices", CUDA in multiprocessing: the CUDA
    runtime does not support the ``fork`` start method once CUDA is initialised.

    Returns:
        "ok" when ``torch.cuda.is_initialized()`` is False (or torch is not imported).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return Check("cuda state", "ok", "torch not imported: CUDA not initialised")
    if not torch.cuda.is_initialized():
        return Check("cuda state", "ok", "CUDA not initialised in this process")
    return Check(
        "cuda state",
        "warn",
        "CUDA is already initialised in this process",
        "lk.launch is safe anyway (ranks fork from a separate worker), but fork-based code "
        "(torch.multiprocessing with 'fork', DataLoader workers) breaks in the children: "
        "restart the kernel and touch CUDA only after forking, or use 'spawn'",
    )
