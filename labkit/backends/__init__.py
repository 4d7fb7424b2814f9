"""Communication backends written for the course, registered with torch.distributed.

Introduced in notebooks/04_custom_backend.ipynb.

Each module registers its backend when imported (``lk.launch(fn, backend="labkit_shm")`` imports
it inside every rank): ``shm`` (shared memory between ranks on one host), ``recording`` (wraps
any backend and records every operation), ``simnet`` (wraps a backend and delays each operation
as a described network would), ``cpp`` (a minimal backend in C++ built at run time).
``simlink`` (``simnet`` with one operation at a time on the link) is used through its ``spec``.
This package imports nothing heavy itself.
"""

from __future__ import annotations

import importlib

# Loaded on first use, so that lk.backends.recording.spec(...) works after `import labkit`.
_SUBMODULES = {"cpp", "cpp_build", "recording", "shm", "simlink", "simnet"}


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"labkit.backends.{name}")
    raise AttributeError(f"module 'labkit.backends' has no attribute {name!r}")
