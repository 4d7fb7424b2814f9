"""Profiling a distributed step, and speedups measured against a baseline in the same run.

Introduced in notebooks/20_performance_tuning.ipynb.

Inside each rank (a function run by ``lk.launch``)::

    prof = lk.profile.profile_steps(step, trace_dir, wait=1, warmup=1, active=3)
    return prof  # trace path, PyTorch's op table, compute / comm spans

In the notebook::

    lk.profile.comm_compute(profiles)  # ms and fractions per rank
    lk.profile.merge_traces([json.load(open(p.trace_path)) for p in profiles], "all.json")
    table = lk.profile.SpeedupTable.slowest_rank(per_rank_tables)
    print(table.format())

``measure_speedups`` (run on every rank) times a baseline and its variants in interleaved
rounds. ``saved_tensors`` (notebooks 15–16) records what autograd keeps for backward,
``largest_tensor`` (notebook 16) the largest tensor a block of code makes, ``matmul_flops``
(notebook 16) the FLOPs of its matrix products; ``count_flops`` and ``mfu`` (``mfu.py``,
notebook 20) the model FLOPs of a step and the share of the peak they use.
Importing this package imports torch only when a profile is taken.
"""

from __future__ import annotations

from labkit.profile.flops import MatmulFlops, matmul_flops
from labkit.profile.gpu_memory import (
    CUDA_BLOCK_BYTES,
    CudaMemory,
    cuda_block_bytes,
    cuda_memory,
    cuda_tensor_bytes,
)
from labkit.profile.largest import LargestTensor, largest_tensor
from labkit.profile.mfu import count_flops, dense_training_flops, mfu
from labkit.profile.profiler import (
    CommComputeRow,
    OpRow,
    RankProfile,
    comm_compute,
    is_comm_op,
    profile_steps,
    trace_spans,
)
from labkit.profile.saved import SavedTensor, SavedTensors, saved_tensors
from labkit.profile.speedup import SpeedupRow, SpeedupTable, amdahl_speedup, measure_speedups
from labkit.profile.streams import (
    KernelSpan,
    NcclOverlap,
    ThreadSplit,
    collective_threads,
    gpu_kernels,
    is_nccl_kernel,
    nccl_overlap,
)
from labkit.profile.traces import check_profiler_trace, merge_traces, self_times

__all__ = [
    "CUDA_BLOCK_BYTES",
    "CommComputeRow",
    "CudaMemory",
    "KernelSpan",
    "LargestTensor",
    "MatmulFlops",
    "NcclOverlap",
    "OpRow",
    "RankProfile",
    "SavedTensor",
    "SavedTensors",
    "SpeedupRow",
    "SpeedupTable",
    "ThreadSplit",
    "amdahl_speedup",
    "check_profiler_trace",
    "collective_threads",
    "comm_compute",
    "count_flops",
    "cuda_block_bytes",
    "cuda_memory",
    "cuda_tensor_bytes",
    "dense_training_flops",
    "gpu_kernels",
    "is_comm_op",
    "is_nccl_kernel",
    "largest_tensor",
    "matmul_flops",
    "measure_speedups",
    "merge_traces",
    "mfu",
    "nccl_overlap",
    "profile_steps",
    "saved_tensors",
    "self_times",
    "trace_spans",
]
