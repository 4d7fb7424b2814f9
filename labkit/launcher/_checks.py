"""Check a launch request before any process starts; every error says what to do instead."""

from __future__ import annotations

import inspect
import math
import os
import socket
from dataclasses import dataclass

from labkit.launcher._backend_spec import BackendSpec
from labkit.launcher.launch_log import note_launch

# Backends that labkit implements itself: name -> module whose import registers it with
# torch.distributed. The ranks import the module before init_process_group.
LABKIT_BACKENDS: dict[str, str] = {
    "labkit_shm": "labkit.backends.shm",
    "labkit_record": "labkit.backends.recording",
    "labkit_simnet": "labkit.backends.simnet",
    "labkit_cpp": "labkit.backends.cpp",
}

BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")


@dataclass(frozen=True)
class Plan:
    world_size: int
    backend: str
    backend_spec: BackendSpec | None  # registers a non-builtin backend inside each rank
    device: str  # may contain "{rank}", filled in by each rank
    threads: int  # torch intra-op threads per rank
    timeout: float
    pg_timeout: float  # longer than timeout, so the launcher's diagnosis (with stacks) wins
    loopback_if: str | None
    verbose: bool


def max_world_size() -> int:
    """The largest world the launcher accepts on this machine (override: LABKIT_MAX_WORLD_SIZE)."""
    env = os.environ.get("LABKIT_MAX_WORLD_SIZE")
    if env:
        return int(env)
    return max(16, 4 * (os.cpu_count() or 1))


def loopback_interface() -> str | None:
    """Name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    for name in ("lo", "lo0"):
        if name in names:
            return name
    return None


def check_fn(fn, args: tuple, kwargs: dict) -> None:
    if not callable(fn):
        raise ValueError(
            f"fn must be a function to run on every rank, got {type(fn).__name__}: {fn!r}. "
            "Pass the function itself, e.g. lk.launch(my_fn, world_size=2), not my_fn()."
        )
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some callables have no signature; let them run
    try:
        sig.bind(0, 1, *args, **kwargs)
    except TypeError as exc:
        raise ValueError(
            f"fn{sig} cannot be called as fn(rank, world_size, *args, **kwargs) with "
            f"{len(args)} extra positional and {sorted(kwargs)} keyword argument(s): {exc}. "
            "Its first two parameters receive the rank and the world size."
        ) from None


def check_world_size(world_size) -> int:
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise ValueError(f"world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    limit = max_world_size()
    if world_size > limit:
        raise ValueError(
            f"world_size={world_size} is too many processes for this machine "
            f"({os.cpu_count()} CPU cores; the limit here is {limit}). Every rank is a process: "
            "use 2-4 ranks on a laptop, or set LABKIT_MAX_WORLD_SIZE if you really mean it."
        )
    return world_size


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_backend(backend, world_size: int, device: str) -> tuple[str, BackendSpec | None]:
    """The backend name to initialise, and the spec that registers it in the ranks (if any)."""
    if isinstance(backend, BackendSpec):
        return backend.name.lower(), backend
    name = _resolve_builtin(backend, world_size, device)
    if name in LABKIT_BACKENDS:
        return name, BackendSpec(name, module=LABKIT_BACKENDS[name])
    return name, None


def available_labkit_backends() -> list[str]:
    """labkit's own backends whose modules exist in this installation."""
    import importlib.util

    found = []
    for name, module in LABKIT_BACKENDS.items():
        try:
            if importlib.util.find_spec(module) is not None:
                found.append(name)
        except ModuleNotFoundError:
            pass
    return found


def _resolve_builtin(backend: str, world_size: int, device: str) -> str:
    import torch
    import torch.distributed as dist

    if not isinstance(backend, str):
        raise ValueError(
            f"backend must be a name such as 'gloo' or an lk.BackendSpec, got {backend!r}"
        )
    name = backend.lower()
    if name == "tcp":
        raise ValueError(
            "backend='tcp' no longer exists: PyTorch removed it in 1.0. Use 'gloo' for CPU "
            "tensors (or 'nccl' on GPUs); 'tcp://host:port' was an init_method, not a backend."
        )
    if name == "auto":
        gpus = _gpu_count()
        wants_cpu = device == "cpu"
        if not wants_cpu and gpus >= world_size and dist.is_nccl_available():
            return "nccl"
        return "gloo"
    ours = available_labkit_backends()
    known = set(BUILTIN_BACKENDS) | set(ours)
    known |= {b.lower() for b in getattr(dist.Backend, "backend_list", [])}
    if name not in known:
        raise ValueError(
            f"unknown backend {backend!r}. Available here: 'auto', 'gloo'"
            + (", 'nccl'" if dist.is_nccl_available() else "")
            + "".join(f", {b!r}" for b in sorted(ours))
            + ", or an lk.BackendSpec for a backend of your own"
        )
    if name == "nccl":
        if not dist.is_nccl_available():
            raise RuntimeError(
                "backend='nccl' needs NVIDIA GPUs and a CUDA build of PyTorch; this one is "
                f"torch {torch.__version__} without NCCL. Use backend='gloo' (CPU)."
            )
        gpus = _gpu_count()
        if gpus < world_size:
            raise RuntimeError(
                f"backend='nccl' needs one GPU per rank: world_size={world_size} but this "
                f"machine has {gpus} GPU(s). Use backend='gloo' (CPU) or fewer ranks."
            )
    if name == "gloo" and not dist.is_gloo_available():
        raise RuntimeError("this PyTorch build has no gloo backend; reinstall torch")
    return name


# labkit's backends that register for CPU tensors only (``devices=["cpu"]``): a CUDA tensor
# reaches them only to fail at its first operation with torch's generic "no backend" error.
CPU_ONLY_BACKENDS = ("labkit_shm", "labkit_cpp")


def resolve_device(device: str, backend: str, world_size: int) -> str:
    if not isinstance(device, str):
        device = str(device)
    if device == "auto":
        return "cuda:{rank}" if backend == "nccl" else "cpu"
    if device == "cpu":
        if backend == "nccl":
            raise ValueError("backend='nccl' works on CUDA tensors only; use device='cuda'")
        return "cpu"
    if device in ("cuda", "cuda:{rank}"):
        if backend in CPU_ONLY_BACKENDS:
            raise ValueError(
                f"backend={backend!r} moves CPU tensors only (its ranks exchange host memory); "
                "it cannot serve device='cuda'. Use device='cpu' with it, or backend='nccl' "
                "(or 'auto') for CUDA tensors."
            )
        gpus = _gpu_count()
        if gpus < world_size:
            raise RuntimeError(
                f"device='cuda' puts rank r on GPU r: world_size={world_size} needs "
                f"{world_size} GPUs, this machine has {gpus}. Use device='cpu' or fewer ranks."
            )
        return "cuda:{rank}"
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")


def make_plan(world_size, backend, device, timeout, verbose) -> Plan:
    world_size = check_world_size(world_size)
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"timeout must be a positive number of seconds, got {timeout!r}: every launch "
            "has a deadline, so a deadlock ends with a diagnosis instead of a hang"
        )
    backend, spec = resolve_backend(backend, world_size, device)
    device = resolve_device(device, backend, world_size)
    threads = max(1, (os.cpu_count() or 1) // world_size)
    note_launch(backend, device, world_size)  # what "auto" became, for the course report
    return Plan(
        world_size,
        backend,
        spec,
        device,
        threads,
        float(timeout),
        float(timeout) + 60.0,
        loopback_interface(),
        bool(verbose),
    )


def _dumps(obj) -> bytes:
    """cloudpickle, but code objects keep their file name.

    cloudpickle >= 3.1 renames every shipped function's file to ``<dynamic-code>``; keeping the
    real one (a notebook cell's ``/tmp/ipykernel_.../N.py``) lets the launcher show the source
    line of each frame in a rank's traceback and stack dump.
    """
    import importlib
    import io
    import pickle
    import sys
    import types
    from collections import ChainMap

    import cloudpickle

    base = cloudpickle.Pickler.dispatch_table.get(types.CodeType)
    if base is None:  # an older cloudpickle keeps file names by itself
        return cloudpickle.dumps(obj)

    def reduce_code(code):
        ctor, args = base(code)
        keep = code.co_filename
        return ctor, tuple(keep if a == "<dynamic-code>" else a for a in args)

    class _Pickler(cloudpickle.Pickler):
        dispatch_table = ChainMap({types.CodeType: reduce_code}, cloudpickle.Pickler.dispatch_table)

        def reducer_override(self, obj):
            # torch.backends.* are instances of module subclasses, which cloudpickle tries to
            # copy by value (and fails); any module that is in sys.modules goes by name.
            if isinstance(obj, types.ModuleType) and type(obj) is not types.ModuleType:
                name = getattr(obj, "__name__", None)
                if name and sys.modules.get(name) is obj:
                    return importlib.import_module, (name,)
            return super().reducer_override(obj)

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def pickle_call(fn, args: tuple, kwargs: dict, spec: BackendSpec | None = None) -> bytes:
    """Serialise the call by value (works for lambdas and closures defined in a notebook)."""
    import cloudpickle

    try:
        return _dumps((fn, args, kwargs, spec))
    except Exception as exc:  # noqa: BLE001 - find the culprit for the message
        culprit = "fn (or something it uses from the notebook)"
        for i, a in enumerate(args):
            try:
                cloudpickle.dumps(a)
            except Exception:  # noqa: BLE001
                culprit = f"args[{i}] ({type(a).__name__})"
                break
        for k, v in kwargs.items():
            try:
                cloudpickle.dumps(v)
            except Exception:  # noqa: BLE001
                culprit = f"kwargs[{k!r}] ({type(v).__name__})"
                break
        raise ValueError(
            f"{culprit} cannot be sent to the ranks: {type(exc).__name__}: {exc}. Ranks are "
            "separate processes; pass plain data, or create the object inside fn."
        ) from exc
