"""Lab scripts that ``torchrun`` runs unchanged on one machine or many.

Introduced in notebooks/06_data_parallel.ipynb (``train_ddp``) and
notebooks/19_fault_tolerance.ipynb (``train_elastic``); docs/multinode.md shows how to run
them on several nodes, under Slurm and on Kubernetes, and which lab each one serves.

- ``train_ddp``: data-parallel training of an MLP on digits (PyTorch DDP, or labkit's
  ``DataParallelBucketed`` with ``--ddp labkit``); gradient accumulation with one
  all-reduce per step, clipping after it and bf16 autocast (``--accum-steps``, ``--clip``,
  ``--precision``: notebook 09), per-rank profiler traces (``--profile``: notebook 20).
- ``train_elastic``: the same, with a checkpoint every k steps, resume from the newest
  complete checkpoint on start, and ``--kill-at-step`` fault injection for torchrun's
  ``--max-restarts``.
- ``train_async``: synchronous SGD, an asynchronous parameter server on rank 0, and local
  SGD (``--mode``), with a straggler (``--slow-rank``, ``--slowdown``): notebook 08.
- ``train_model_split``: an MLP on digits cut into one stage per rank (notebook 10).
- ``train_gpt``: TinyGPT on the character corpus under any of the capstone's strategies
  (``--strategy`` dp, zero1-3, fsdp, pp, tp, dp_tp, fsdp_tp, dp_pp, dp_pp_tp: notebooks 11-13, 18
  and 21), composed by ``labkit.parallel.compose`` as in the notebooks.
- ``debug_collectives``: one all-reduce, or a mismatched or skipped collective on purpose, with
  a JSON report per worker and its flight recorder dump, to read what
  ``TORCH_DISTRIBUTED_DEBUG`` and ``NCCL_DEBUG`` report (notebook 19).

Each script's module docstring has its exact command, e.g.::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_ddp --steps 20

Every script reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` from torchrun's environment,
trains deterministically on CPU, and prints a checksum of its final parameters, so runs on
one node and on two can be compared bit for bit.
"""
