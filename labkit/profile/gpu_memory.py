"""GPU memory of one region of code, measured with the CUDA caching allocator's statistics.

Introduced in notebooks/10_model_parallel.ipynb (memory per stage) and used again in
notebooks/13_zero_and_fsdp.ipynb (memory per ZeRO rank).

``torch.cuda.max_memory_allocated(dev)`` counts the bytes of the blocks the caching allocator
has handed to tensors, each request rounded up to a multiple of 512 bytes (``kMinBlockSize``
in c10/cuda/CUDACachingAllocator.cpp, ``round_size``). It does not count the segments the
allocator reserved from the driver (``torch.cuda.memory_reserved``: 2 MiB segments for the
small pool, larger ones for big tensors), nor memory CUDA libraries take with ``cudaMalloc``
themselves (the CUDA context, NCCL's buffers). A request of at most 1 MiB comes from the small
pool, whose blocks are split down to the rounded size, so it counts exactly
``cuda_block_bytes(n)``; above 1 MiB a block is split only if more than 1 MiB would remain,
so a large tensor may count up to 1 MiB more (``should_split``, same file).

Inside a rank (``lk.launch`` with ``device="cuda"``)::

    with lk.profile.cuda_memory(dev) as mem:
        ...  # exactly the code whose memory the model predicts
    mem.peak_bytes, mem.end_bytes  # above what was allocated when the region began
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["CUDA_BLOCK_BYTES", "CudaMemory", "cuda_block_bytes", "cuda_memory", "cuda_tensor_bytes"]

CUDA_BLOCK_BYTES = 512  # kMinBlockSize: every allocation is a multiple of it
SMALL_REQUEST_BYTES = 1 << 20  # kSmallSize: requests up to this come from the small pool


def cuda_block_bytes(n_bytes: int) -> int:
    """Bytes ``torch.cuda.memory_allocated`` counts for one tensor of ``n_bytes``.

    The caching allocator rounds every request up to a multiple of 512 bytes; an empty
    tensor allocates nothing. Exact for ``n_bytes <= 1 MiB`` (the small pool); a lower bound
    above it, where an unsplit block may count up to 1 MiB more.

    Args:
        n_bytes: the tensor's ``numel() * element_size()``.

    Returns:
        int: ``n_bytes`` rounded up to a multiple of 512 (0 for 0).

    Raises:
        ValueError: a negative size.
    """
    if n_bytes < 0:
        raise ValueError(f"a tensor cannot have {n_bytes} bytes")
    return -(-n_bytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES


def cuda_tensor_bytes(tensors: Iterable[Any]) -> int:
    """What the caching allocator counts for these tensors' distinct CUDA storages.

    Each storage counts once (views of one buffer share it), rounded with
    ``cuda_block_bytes``; ``None`` entries, non-tensors and tensors not on a CUDA device
    (Adam's ``step`` counters stay on the host) count nothing. On CPU tensors it gives 0;
    ``cuda_block_bytes`` over their sizes gives what a GPU would count.

    Args:
        tensors: tensors, in any mix of devices.

    Returns:
        int: the rounded bytes of the distinct CUDA storages.
    """
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if t is None or not hasattr(t, "untyped_storage") or not t.is_cuda:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            continue
        seen.add(storage.data_ptr())
        total += cuda_block_bytes(storage.nbytes())
    return total


@dataclass
class CudaMemory:
    """One region's GPU memory, in bytes above what was allocated when it began.

    Attributes:
        device: the CUDA device measured.
        base_bytes: ``torch.cuda.memory_allocated(device)`` when the region began (tensors
            allocated before it, the cuBLAS workspaces of earlier matmuls).
        peak_bytes: ``max_memory_allocated`` during the region minus ``base_bytes``.
        end_bytes: ``memory_allocated`` at its end minus ``base_bytes``: what it left alive.
    """

    device: Any
    base_bytes: int
    peak_bytes: int = 0
    end_bytes: int = 0


@contextmanager
def cuda_memory(device: Any) -> Iterator[CudaMemory]:
    """Measure the peak and the remaining GPU memory of the code inside the ``with``.

    Synchronizes the device before reading the base (kernels queued earlier have finished
    allocating), resets its peak statistic (``torch.cuda.reset_peak_memory_stats``), and at
    the end synchronizes again and reads ``torch.cuda.max_memory_allocated`` and
    ``torch.cuda.memory_allocated``. Allocations happen when an op is issued, on the host,
    so the peak covers every op the region issued. Run warm-up work first: the first matmul
    on a thread allocates a cuBLAS workspace that would otherwise count.

    Args:
        device: a CUDA device (``lk.get_device()`` on a CUDA rank).

    Yields:
        CudaMemory: filled in when the ``with`` block ends.

    Raises:
        ValueError: ``device`` is not a CUDA device.
    """
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"cuda_memory measures a CUDA device, got {dev}")
    torch.cuda.synchronize(dev)
    mem = CudaMemory(dev, torch.cuda.memory_allocated(dev))
    torch.cuda.reset_peak_memory_stats(dev)
    yield mem
    torch.cuda.synchronize(dev)
    mem.peak_bytes = torch.cuda.max_memory_allocated(dev) - mem.base_bytes
    mem.end_bytes = torch.cuda.memory_allocated(dev) - mem.base_bytes
