"""``labkit_shm``: a torch.distributed backend whose ranks exchange data through shared memory.

Introduced in notebooks/04_custom_backend.ipynb.

Importing this module registers the backend with torch (idempotent), so unmodified PyTorch
code — ``dist.all_reduce``, ``DistributedDataParallel``, FSDP2's ``fully_shard`` — runs on it::

    import labkit.backends.shm  # registers "labkit_shm"
    dist.init_process_group(backend="labkit_shm", ...)

or, from a notebook, ``lk.launch(fn, world_size=4, backend="labkit_shm")``. Ranks must be on
one host. Each group maps one segment in /dev/shm (unlinked as soon as every rank has mapped
it); collectives run in rounds over per-rank slots synchronised by counters in the segment,
send/recv go through per-pair ring mailboxes. Mismatched calls raise the same RuntimeError on
every rank; a dead peer or the group's timeout raises one that names the rank and the
operation. Segment sizes: ``LABKIT_SHM_SLOT_BYTES`` (per rank and buffer, default 1 MiB) and
``LABKIT_SHM_MAIL_BYTES`` (per rank pair, default 64 KiB to 1 MiB); a group of 4 ranks maps
about 18 MiB. The parts live in ``labkit/backends/_shm/``.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

from labkit.backends._shm.group import BACKEND_NAME, ShmProcessGroup

__all__ = ["BACKEND_NAME", "ShmProcessGroup", "create_process_group", "register"]


def create_process_group(store, rank: int, world_size: int, timeout: timedelta):
    """The creator torch calls for ``init_process_group(backend="labkit_shm")``.

    Args:
        store: the group's store (a PrefixStore that c10d made for this group).
        rank: this process's rank in the group.
        world_size: ranks in the group.
        timeout: the group's timeout for every wait.

    Returns:
        A ``ShmProcessGroup`` (a ``dist.ProcessGroup`` subclass; torch uses it as the group).

    Raises:
        RuntimeError: a rank died or did not join in time, or /dev/shm is too small.
    """
    return ShmProcessGroup(store, rank, world_size, timeout)


def register() -> None:
    """Register ``labkit_shm`` with torch.distributed (a no-op when it already is)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["cpu"])


register()
