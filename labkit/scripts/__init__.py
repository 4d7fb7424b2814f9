"""Lab scripts that ``torchrun`` runs unchanged on one machine or many.

Introduced in notebooks/06_data_parallel.ipynb (``train_ddp``) and
notebooks/15_fault_tolerance.ipynb (``train_elastic``); docs/multinode.md shows how to run
them on several nodes, under Slurm and on Kubernetes.

- ``train_ddp``: data-parallel training of an MLP on digits (PyTorch DDP, or labkit's
  ``DataParallelBucketed`` with ``--ddp labkit``).
- ``train_elastic``: the same, with a checkpoint every k steps, resume from the newest
  complete checkpoint on start, and ``--kill-at-step`` fault injection for torchrun's
  ``--max-restarts``.

Each script's module docstring has its exact command, e.g.::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_ddp --steps 20

Every script reads ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` from torchrun's environment,
trains deterministically on CPU, and prints a checksum of its final parameters, so runs on
one node and on two can be compared bit for bit.
"""
