"""Data parallelism from scratch: every rank holds the whole model and averages gradients.

Introduced in notebooks/06_data_parallel.ipynb (``DataParallelNaive``) and
notebooks/07_ddp_buckets_and_overlap.ipynb (``DataParallelBucketed``).

In the order a learner meets them (picotron's ``data_parallel/`` names):

- ``DataParallelNaive``: broadcast the parameters from the group's first rank, then after
  each backward all-reduce every gradient, one collective per parameter.
- ``DataParallelBucketed``: gradients grouped into size-capped buckets in reverse
  registration order, each bucket all-reduced asynchronously as soon as its last gradient is
  ready, so communication overlaps the rest of backward (Li et al. 2020, "PyTorch
  Distributed: Experiences on Accelerating Data Parallel Training", §3.2.3, and
  ``torch/csrc/distributed/c10d/reducer.cpp``); ``no_sync()`` for gradient accumulation.
- ``assign_buckets``: the bucket assignment alone, with no process group.
- ``in_bucket_order``: a PyTorch DDP comm hook run one bucket at a time, so that hooks that
  issue collectives from callbacks (PowerSGD) issue them in one order on every rank of a CPU
  backend.

Both wrappers, like ``torch.nn.parallel.DistributedDataParallel``, need no extra call: when
``loss.backward()`` returns, every ``.grad`` holds the average over the group's ranks.
"""

from __future__ import annotations

from labkit.parallel.ddp.bucketed import DataParallelBucketed
from labkit.parallel.ddp.buckets import assign_buckets
from labkit.parallel.ddp.hooks import in_bucket_order
from labkit.parallel.ddp.naive import DataParallelNaive, broadcast_state

__all__ = [
    "DataParallelBucketed",
    "DataParallelNaive",
    "assign_buckets",
    "broadcast_state",
    "in_bucket_order",
]
