"""Backends that are not built into torch: registered inside every rank before the group forms.

Introduced in notebooks/04_custom_backend.ipynb.

Ranks are fresh processes: a backend registered in the notebook with
``dist.Backend.register_backend`` is unknown to them. A ``BackendSpec`` travels with the call
(by value, so a creator written in a notebook cell works) and registers itself in each rank.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class BackendSpec:
    """A communication backend for ``lk.launch(fn, backend=BackendSpec(...))``.

    Args:
        name: the name ``init_process_group(backend=name)`` will use.
        creator: ``creator(store, rank, world_size, timeout)`` returning the process group (or
            ``creator(common_opts, backend_opts)`` with ``extended_api=True``), as
            ``torch.distributed.Backend.register_backend`` expects. Omit it when importing
            ``module`` registers the backend.
        module: a module whose import registers the backend (imported in each rank).
        devices: device types the backend serves.
        extended_api: pass ``extended_api=True`` to ``register_backend``.
    """

    name: str
    creator: Callable | None = None
    module: str | None = None
    devices: tuple[str, ...] = ("cpu",)
    extended_api: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"backend name must be an identifier, got {self.name!r}")
        if self.creator is None and self.module is None:
            raise ValueError(f"BackendSpec({self.name!r}) needs a creator or a module to import")
        if self.creator is not None and not callable(self.creator):
            raise ValueError(f"creator of {self.name!r} must be callable, got {self.creator!r}")

    def prepare(self) -> None:
        """Register the backend in this process (idempotent). Runs in each rank."""
        import torch.distributed as dist

        if self.module:
            importlib.import_module(self.module)
        registered = dist.Backend.backend_list  # register_backend appends lower-case names
        if self.creator is not None and self.name.lower() not in registered:
            dist.Backend.register_backend(
                self.name, self.creator, extended_api=self.extended_api, devices=list(self.devices)
            )
        if self.name.lower() not in dist.Backend.backend_list:
            raise RuntimeError(f"importing {self.module!r} did not register backend {self.name!r}")
