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
    """One GPU as ``nvidia-smi`` (or torch in a subprocess) reports it; memory in MiB."""

    name: str
    memory_total_mib: int
    memory_used_mib: int


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


def parse_gpu_csv(text: str) -> tuple[Gpu, ...]:
    """Parse ``name, 81559 MiB, 1 MiB`` lines (nvidia-smi's CSV without header).

    Args:
        text: the command's stdout.

    Returns:
        One :class:`Gpu` per non-empty line.

    Raises:
        ValueError: a line does not have that shape.
    """
    gpus = []
    for line in text.strip().splitlines():
        if not line.strip():
            continue
        name, total, used = (part.strip() for part in line.rsplit(",", 2))
        gpus.append(Gpu(name, int(total.split()[0]), int(used.split()[0])))
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
        cmd = [smi, "--query-gpu=name,memory.total,memory.used", "--format=csv,noheader"]
        source, timeout = "nvidia-smi", 10.0
    else:
        try:
            import torch

            gpu_build = bool(torch.version.cuda or getattr(torch.version, "hip", None))
        except ImportError:
            gpu_build = False
        if not gpu_build:
            return GpuQuery((), "none")
        cmd = [sys.executable, "-c", _TORCH_GPU_QUERY]
        source, timeout = "torch subprocess", 60.0
    try:
        done = _run(cmd, timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuQuery((), source, f"{source} did not answer: {exc}")
    if done.returncode != 0:
        last = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        return GpuQuery((), source, f"{source} exited with {done.returncode}: {last[0]}")
    try:
        return GpuQuery(parse_gpu_csv(done.stdout), source)
    except ValueError:
        return GpuQuery((), source, f"unexpected {source} output: {done.stdout[:200]!r}")


def check_gpus(query: GpuQuery) -> Check:
    """Report the GPUs: count, names and memory (found by :func:`query_gpus`).

    Args:
        query: the result of :func:`query_gpus`.

    Returns:
        "ok" (GPUs, or none: CPU is fine), "warn" when the query failed, a GPU is mostly
        full already, or torch is a CPU build that cannot use the GPUs present.
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
    try:
        import torch

        cpu_torch = not (torch.version.cuda or getattr(torch.version, "hip", None))
    except ImportError:
        cpu_torch = False
    if cpu_torch:
        return Check(
            "gpus",
            "warn",
            detail + "\ntorch is a CPU build: it cannot use these GPUs",
            "install a CUDA build of torch to use them (CPU with gloo works meanwhile)",
        )
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
