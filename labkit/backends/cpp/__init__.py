"""labkit_cpp: a minimal c10d backend written in C++, compiled at run time, registered on import.

Introduced in notebooks/04_custom_backend.ipynb.

This is the route PyTorch's extension mechanism intends for a production backend: a subclass
of ``c10d::Backend`` in C++ (``labkit_backend.cpp`` next to this file: all_reduce with SUM,
AVG, PRODUCT, MIN, MAX and the bitwise ops, broadcast, all_gather and barrier, for CPU
tensors of any dtype), compiled with ``torch.utils.cpp_extension.load``, exposed to Python
with pybind11, and registered with ``torch.distributed.Backend.register_backend("labkit_cpp",
creator, devices=["cpu"])``, where ``creator(store, rank, world_size, timeout)`` constructs
the C++ object. Its data moves through the c10d Store that ``init_process_group`` passes in,
so no transport had to be written (the C++ file's comments say what gloo and NCCL do instead).

Importing this module builds the extension if needed (25-60 s the first time on a
2-core laptop; the library is cached in torch's extensions directory, later imports take
well under a second) and registers the backend. Then::

    import labkit as lk
    lk.launch(fn, world_size=2, backend="labkit_cpp")  # each rank imports this module

or, in a script, ``import labkit.backends.cpp`` before
``dist.init_process_group("labkit_cpp", ...)``. Importing it in the notebook first moves the
one-time build out of the ranks; ranks that import it at the same moment build it once
(``labkit.backends.cpp_build.load_locked``).

Raises (on import):
    RuntimeError: ``labkit_cpp needs a C++ compiler (g++ or clang++) ...`` when there is none;
        ``labkit.backends.cpp_build.available()`` asks without raising.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import torch.distributed as dist

from labkit.backends.cpp_build import BuildInfo, available, load_locked

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Backend as C10dBackend

__all__ = ["BACKEND_NAME", "available", "build", "build_info", "create_backend", "register"]

BACKEND_NAME = "labkit_cpp"
EXTENSION_NAME = "labkit_cpp_backend"
SOURCE = Path(__file__).resolve().with_name("labkit_backend.cpp")

_lock = threading.Lock()
_state: dict = {}  # "extension": the loaded module, "info": its BuildInfo


def build(verbose: bool = False) -> ModuleType:
    """Compile (if needed) and load the C++ extension; once per process, thread- and rank-safe.

    Args:
        verbose: show cpp_extension's build log (compiler command lines).

    Returns:
        The extension module (its ``create_backend(store, rank, size, timeout)`` builds the
        C++ backend).

    Raises:
        RuntimeError: no C++ compiler or ninja, or the compilation failed.
    """
    with _lock:
        if "extension" not in _state:
            if not SOURCE.exists():
                raise RuntimeError(
                    f"labkit_cpp's C++ source {SOURCE} is missing from this installation: "
                    "install labkit from its repository (pip install -e .)"
                )
            module, info = load_locked(EXTENSION_NAME, [str(SOURCE)], verbose=verbose)
            _state.update(extension=module, info=info)
        return _state["extension"]


def build_info() -> BuildInfo:
    """How this process got the extension: compiled or cached, and the seconds it took.

    Returns:
        The ``BuildInfo`` of the ``build()`` that ran in this process.

    Raises:
        RuntimeError: ``build()`` has not run in this process.
    """
    if "info" not in _state:
        raise RuntimeError("labkit_cpp has not been built in this process: call build() first")
    return _state["info"]


def create_backend(
    store: dist.Store, rank: int, world_size: int, timeout: timedelta
) -> C10dBackend:
    """The creator ``register_backend`` calls: construct the C++ backend for one group.

    Args:
        store: the group's store (a PrefixStore scoped to the group); data moves through it.
        rank: this process's rank in the group.
        world_size: the group's size.
        timeout: how long a collective waits for its peers.

    Returns:
        The C++ ``c10d::Backend`` (as ``torch._C._distributed_c10d.Backend``).

    Raises:
        RuntimeError: the extension cannot be built here.
    """
    return build().create_backend(store, rank, world_size, timeout)


def register() -> None:
    """Register ``labkit_cpp`` with torch.distributed for CPU tensors (idempotent).

    Raises:
        RuntimeError: the extension cannot be built here.
    """
    build()
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, create_backend, devices=["cpu"])


register()
