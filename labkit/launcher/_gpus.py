"""How many GPUs this process can give its ranks, counted without initialising CUDA here.

Introduced in notebooks/00_setup_and_launcher.ipynb (``device="auto"`` asks it).

``torch.cuda.is_available()`` calls ``cudaGetDeviceCount``, which initialises the CUDA driver
(``cuInit``) in the calling process unless ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set (its
docstring in torch 2.13), and a process with an initialised driver cannot fork children that
use CUDA: PyTorch's multiprocessing notes ("CUDA in multiprocessing": "The CUDA runtime does
not support the fork start method"; "Poison fork in multiprocessing"). The kernel that
launches ranks also forks DataLoader workers, so it counts GPUs the way
``torch.cuda.device_count()`` does before CUDA is initialised — through NVML
(``torch.cuda._device_count_nvml``, which honours ``CUDA_VISIBLE_DEVICES``) — and never falls
back to the CUDA runtime in this process: where NVML cannot answer (no NVML library, MIG
UUIDs, ROCm) a short-lived subprocess asks torch.

NVML counts the GPUs the driver lists; it does not check that this torch build can run on
them (a driver too old for the build's CUDA: torch 2.13's CUDA 13 wheel needs a 580-series
driver). So where NVML lists GPUs, one subprocess per ``CUDA_VISIBLE_DEVICES`` value asks torch
(cached for the process), and only the GPUs torch can use count; a note says when they differ,
and ``labkit doctor`` says why.
"""

from __future__ import annotations

import functools
import os
import sys

from labkit.preflight.torch_cuda import probe_torch_cuda

__all__ = ["gpu_count"]


def gpu_count() -> int:
    """CUDA GPUs visible to this process, counted without initialising CUDA in it.

    Returns:
        int: 0 on a CPU-only torch build, without torch, or when NVML lists no GPU;
        ``torch.cuda.device_count()`` when this process has initialised CUDA already (nothing
        left to protect); else the GPUs a subprocess's torch can use (0 if it does not
        answer), asked once per ``CUDA_VISIBLE_DEVICES``.
    """
    try:
        import torch  # importing torch does not initialise CUDA
    except ImportError:
        return 0
    cuda = torch.cuda
    if not cuda._is_compiled():  # a CPU build: no CUDA at all
        return 0
    if cuda.is_initialized():
        return cuda.device_count()
    count_nvml = getattr(cuda, "_device_count_nvml", None)
    if count_nvml is not None and not torch.version.hip:
        n = count_nvml()  # negative: NVML could not answer
        if n == 0:
            return 0
        if n > 0:
            # Listed is not usable: once per CUDA_VISIBLE_DEVICES, a subprocess asks torch.
            usable = _probe_in_subprocess(os.environ.get("CUDA_VISIBLE_DEVICES"))
            if usable < n:
                _say_once(
                    f"note: the driver lists {n} GPU(s) but torch can use {usable} (a driver "
                    "too old for this build's CUDA, or GPUs too old for its kernels): "
                    "`labkit doctor` says which; device='auto' counts only the usable ones"
                )
            return usable
    return _probe_in_subprocess(os.environ.get("CUDA_VISIBLE_DEVICES"))


_said: set[str] = set()


def _say_once(note: str) -> None:
    if note not in _said:
        _said.add(note)
        print(note, file=sys.stderr, flush=True)


@functools.lru_cache(maxsize=8)
def _probe_in_subprocess(visible: str | None) -> int:
    """Ask torch in a fresh process (keyed on ``CUDA_VISIBLE_DEVICES``, which changes it)."""
    del visible  # the cache key; the child inherits the environment
    probe = probe_torch_cuda()  # labkit doctor's probe: python -c, bounded in time
    return probe.device_count if probe.available else 0
