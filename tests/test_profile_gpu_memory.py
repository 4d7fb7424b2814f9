"""Tests for labkit/profile/gpu_memory.py: the allocator's rounding and the measured region.

The region is tested with ``torch.cuda``'s statistics replaced by a fake allocator (CPU only);
a GPU test checks the rounding against the real caching allocator.
"""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.profile import gpu_memory as cm


@pytest.mark.parametrize(
    ("n_bytes", "counted"), [(0, 0), (1, 512), (40, 512), (512, 512), (513, 1024), (65536, 65536)]
)
def test_cuda_block_bytes_rounds_up_to_512(n_bytes: int, counted: int) -> None:
    assert lk.profile.cuda_block_bytes(n_bytes) == counted


def test_cuda_block_bytes_rejects_a_negative_size() -> None:
    with pytest.raises(ValueError, match="cannot have -1 bytes"):
        lk.profile.cuda_block_bytes(-1)


class _FakeCudaTensor:
    """Stands in for a CUDA tensor: a storage address and a size."""

    is_cuda = True

    def __init__(self, ptr: int, n_bytes: int) -> None:
        self._storage = type("S", (), {"data_ptr": lambda s: ptr, "nbytes": lambda s: n_bytes})()

    def untyped_storage(self):
        return self._storage


def test_cuda_tensor_bytes_counts_each_cuda_storage_once_rounded() -> None:
    a, view_of_a, b = _FakeCudaTensor(1, 40), _FakeCudaTensor(1, 40), _FakeCudaTensor(2, 600)
    host = torch.ones(10)  # Adam's step counters live here: not counted
    assert lk.profile.cuda_tensor_bytes([a, view_of_a, b, host, None, 3]) == 512 + 1024
    assert lk.profile.cuda_tensor_bytes([_FakeCudaTensor(3, 0)]) == 0  # a freed storage


class _FakeAllocator:
    """torch.cuda's statistics over a list of live allocations, with a peak."""

    def __init__(self) -> None:
        self.live: dict[int, int] = {}
        self.peak = 0
        self.synced = 0

    def alloc(self, key: int, n_bytes: int) -> None:
        self.live[key] = cm.cuda_block_bytes(n_bytes)
        self.peak = max(self.peak, sum(self.live.values()))

    def free(self, key: int) -> None:
        del self.live[key]

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: self._sync())
        monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d=None: sum(self.live.values()))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d=None: self.peak)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d=None: self._reset())

    def _sync(self) -> None:
        self.synced += 1

    def _reset(self) -> None:
        self.peak = sum(self.live.values())


def test_cuda_memory_measures_the_region_above_its_base(monkeypatch) -> None:
    fake = _FakeAllocator()
    fake.install(monkeypatch)
    fake.alloc(0, 10_000)  # before the region: a workspace, say; and an old peak
    fake.alloc(1, 100_000)
    fake.free(1)
    with lk.profile.cuda_memory("cuda:0") as mem:
        fake.alloc(2, 1000)  # kept: 1024
        fake.alloc(3, 3000)  # a temporary: 3072
        fake.free(3)
    assert mem.base_bytes == cm.cuda_block_bytes(10_000)
    assert (mem.peak_bytes, mem.end_bytes) == (1024 + 3072, 1024)
    assert fake.synced == 2  # before the base is read and before the peak is read


def test_cuda_memory_rejects_a_cpu_device() -> None:
    with pytest.raises(ValueError, match="measures a CUDA device"):
        with lk.profile.cuda_memory("cpu"):
            pass


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_memory_counts_what_the_caching_allocator_counts() -> None:
    dev = torch.device("cuda:0")
    torch.ones(1, device=dev)  # the context and the allocator exist
    shapes = [(10,), (128,), (128, 128), (3, 7)]
    with lk.profile.cuda_memory(dev) as mem:
        kept = [torch.empty(s, device=dev) for s in shapes]
        tmp = torch.empty(1 << 16, device=dev)
        del tmp
    want = sum(cm.cuda_block_bytes(4 * t.numel()) for t in kept)
    assert mem.end_bytes == want == lk.profile.cuda_tensor_bytes(kept)
    assert mem.peak_bytes == want + cm.cuda_block_bytes(4 << 16)
