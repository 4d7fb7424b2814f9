"""Build the process group a wrapping backend delegates to: gloo, NCCL, or a registered backend.

Introduced in notebooks/04_custom_backend.ipynb.

``create_inner(inner, store, rank, size, timeout, global_ranks, group_name)`` returns a
``torch.distributed.ProcessGroup`` for one group, the way ``init_process_group`` would build it
(``torch/distributed/distributed_c10d.py``, ``_new_process_group_helper``):

- ``"gloo"`` / ``"nccl"``: the C++ backend (``ProcessGroupGloo(store, rank, size, timeout)``,
  ``ProcessGroupNCCL(store, rank, size, options)``), registered on a plain C++
  ``ProcessGroup`` for its devices, so every ProcessGroup method (``all_gather_single``, the
  coalesced forms, ...) dispatches to it;
- ``"labkit_shm"``, ``"labkit_simnet"``, ... (labkit's own): their module is imported, which
  registers them; then, like any backend registered with ``dist.Backend.register_backend``,
  or an ``lk.BackendSpec``, their creator is called. A creator that returns a c10d ``Backend``
  (not a ``ProcessGroup``) is registered on a plain ``ProcessGroup`` the same way.

The inner group sees the store under the prefix ``inner/``, apart from anything the wrapper
keeps in it. The wrapping backends (``recording``, ``simnet``, ``simlink``) also share how they
are made: ``inner_group`` in their creator, ``wrapper_spec`` for ``spec()``, ``register_wrapper``
for the name they register on import.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Sequence
from datetime import timedelta

import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist

from labkit.backends.names import LABKIT_BACKENDS
from labkit.launcher import BackendSpec


def inner_name(inner: str | BackendSpec) -> str:
    """The backend name of ``inner`` (lower case)."""
    return (inner.name if isinstance(inner, BackendSpec) else str(inner)).lower()


def inner_devices(inner: str | BackendSpec) -> tuple[str, ...]:
    """Device types the inner backend serves (what the wrapping backend registers for)."""
    if isinstance(inner, BackendSpec):
        return tuple(inner.devices)
    return ("cuda",) if inner_name(inner) == "nccl" else ("cpu",)


def check_inner(inner: object) -> None:
    """Raise unless ``inner`` can name an inner backend.

    Args:
        inner: what a wrapping backend's ``spec`` was given.

    Raises:
        ValueError: ``inner`` is neither a backend name nor an ``lk.BackendSpec``.
    """
    if not isinstance(inner, str | BackendSpec):
        raise ValueError(f"inner must be a backend name or an lk.BackendSpec, got {inner!r}")


def wrapper_spec(
    backend_name: str, inner: str | BackendSpec, creator: Callable, **options
) -> BackendSpec:
    """The spec of a wrapping backend over ``inner``, named ``<backend_name>_<inner>``.

    Args:
        backend_name: the wrapping backend's name (``"labkit_record"``, ...).
        inner: the backend it wraps.
        creator: its extended-API creator; called as ``creator(opts, backend_options,
            inner=inner, **options)``.
        **options: further keyword arguments of ``creator``.

    Returns:
        lk.BackendSpec: for ``lk.launch(fn, backend=...)``, serving ``inner``'s devices.

    Raises:
        ValueError: ``inner`` is neither a backend name nor an ``lk.BackendSpec``.
    """
    check_inner(inner)
    return BackendSpec(
        f"{backend_name}_{inner_name(inner)}",
        creator=functools.partial(creator, inner=inner, **options),
        extended_api=True,
        devices=inner_devices(inner),
    )


def register_wrapper(backend_name: str, creator: Callable, inner_env: str) -> None:
    """Register a wrapping backend by name, over the inner backend ``$inner_env`` (gloo).

    Args:
        backend_name: the name to register (a no-op when it already is).
        creator: its extended-API creator, reading ``inner_env`` when given no inner.
        inner_env: the environment variable naming the inner backend.
    """
    if backend_name not in dist.Backend.backend_list:
        devices = inner_devices(os.environ.get(inner_env, "gloo"))
        dist.Backend.register_backend(
            backend_name, creator, extended_api=True, devices=list(devices)
        )


def inner_group(
    inner: str | BackendSpec, opts: C._DistributedBackendOptions
) -> tuple[dist.ProcessGroup, list[int]]:
    """The inner group for a wrapping backend's creator, and the group's global ranks.

    Args:
        inner: the backend to wrap (as ``create_inner`` takes it).
        opts: the options torch passes an extended-API creator.

    Returns:
        The inner ``ProcessGroup`` and the global rank of each group rank.
    """
    ranks = list(opts.global_ranks_in_group) or list(range(opts.group_size))
    pg = create_inner(
        inner, opts.store, opts.group_rank, opts.group_size, opts.timeout, ranks, opts.group_id
    )
    return pg, ranks


def _on_group(backend, kind, devices: Sequence[str], store, rank: int, size: int):
    pg = dist.ProcessGroup(store, rank, size)
    pg._set_default_backend(kind)
    for device in devices:
        pg._register_backend(torch.device(device), kind, backend)
    return pg


def _gloo(store, rank, size, timeout, global_ranks, group_name):
    backend = C.ProcessGroupGloo(store, rank, size, timeout)
    backend.options.global_ranks_in_group = list(global_ranks)
    backend.options.group_name = group_name
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    return _on_group(backend, dist.ProcessGroup.BackendType.GLOO, devices, store, rank, size)


def _nccl(store, rank, size, timeout, global_ranks, group_name):
    if not dist.is_nccl_available():
        raise RuntimeError("inner backend 'nccl' needs a CUDA build of PyTorch with NCCL")
    opts = C.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    opts.global_ranks_in_group = list(global_ranks)
    opts.group_name = group_name
    backend = C.ProcessGroupNCCL(store, rank, size, opts)
    return _on_group(backend, dist.ProcessGroup.BackendType.NCCL, ["cuda"], store, rank, size)


def create_inner(
    inner: str | BackendSpec,
    store: dist.Store,
    rank: int,
    size: int,
    timeout: timedelta,
    global_ranks: Sequence[int] = (),
    group_name: str = "",
) -> dist.ProcessGroup:
    """Create the process group of backend ``inner`` for one group, as torch would.

    Args:
        inner: ``"gloo"``, ``"nccl"``, a labkit backend name (``"labkit_shm"``, ...), the name
            of any backend registered in this process, or an ``lk.BackendSpec``.
        store: the group's store (the inner group uses it under the prefix ``inner/``).
        rank: this process's rank in the group.
        size: the group's size.
        timeout: the group's timeout.
        global_ranks: global rank of each group rank (empty for the default group).
        group_name: the name torch gives the group.

    Returns:
        dist.ProcessGroup: the inner group, ready for collectives.

    Raises:
        ValueError: ``inner`` names no known backend.
        RuntimeError: ``"nccl"`` without NCCL.
    """
    name = inner_name(inner)
    store = C.PrefixStore("inner/", store)
    ranks = list(global_ranks) or list(range(size))
    if name == "gloo":
        return _gloo(store, rank, size, timeout, ranks, group_name)
    if name == "nccl":
        return _nccl(store, rank, size, timeout, ranks, group_name)
    if isinstance(inner, BackendSpec):
        inner.prepare()
    elif name in LABKIT_BACKENDS:
        importlib.import_module(LABKIT_BACKENDS[name])
    plugin = dist.Backend._plugins.get(name.upper())
    if plugin is None:
        raise ValueError(
            f"no backend {name!r} to wrap: use 'gloo', 'nccl', one of labkit's "
            f"({', '.join(sorted(LABKIT_BACKENDS))}), or an lk.BackendSpec"
        )
    if plugin.extended_api:
        opts = C._DistributedBackendOptions()
        opts.store, opts.group_rank, opts.group_size, opts.timeout = store, rank, size, timeout
        opts.group_id, opts.global_ranks_in_group = group_name, ranks
        pg = plugin.creator_fn(opts, None)
    else:
        pg = plugin.creator_fn(store, rank, size, timeout)
    if isinstance(pg, dist.ProcessGroup):
        return pg
    devices = dist.Backend.backend_capability.get(name, ["cpu"])
    return _on_group(pg, dist.ProcessGroup.BackendType.CUSTOM, devices, store, rank, size)
