"""Run a function on N ranks from a notebook cell, a script or a test.

Introduced in notebooks/00_setup_and_launcher.ipynb.

How it works: the first launch starts one *zygote* process that imports torch once. Each launch
asks it to fork ``world_size`` ranks (milliseconds, instead of seconds of re-importing torch per
rank), ships them the function by value with cloudpickle (so functions, lambdas and closures
defined in a notebook work), hosts the rendezvous store on 127.0.0.1 only, streams each rank's
output into the cell with a ``[rank r]`` prefix, and stops every rank on the first failure, on
the timeout (with each rank's Python stack) or on Ctrl-C. Linux and macOS; on Windows use WSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.launcher._backend_spec import BackendSpec
from labkit.launcher._checks import (
    LABKIT_BACKENDS,
    check_fn,
    fit_ranks,
    launch_choice,
    make_plan,
)
from labkit.launcher._context import backend_for, device_backend, get_device, rank_context
from labkit.launcher._payload import pickle_call
from labkit.launcher._pool import current_zygote_pid, get_zygote, pool_lock, settle, shutdown
from labkit.launcher.errors import LaunchTimeout, RankError, RankFailure
from labkit.launcher.sections import cpu_lab, gpu_count, section_gpus
from labkit.launcher.stretch import stretch

__all__ = [
    "backend_for",
    "BackendSpec",
    "cpu_lab",
    "LABKIT_BACKENDS",
    "LaunchTimeout",
    "RankError",
    "RankFailure",
    "current_zygote_pid",
    "device_backend",
    "fit_ranks",
    "get_device",
    "gpu_count",
    "launch_choice",
    "launch",
    "rank_context",
    "section_gpus",
    "settle",
    "shutdown",
    "stretch",
]


def launch(
    fn: Callable[..., Any],
    world_size: int = 4,
    backend: str | BackendSpec = "auto",
    args: tuple = (),
    kwargs: dict | None = None,
    timeout: float = 120.0,
    device: str = "auto",
    verbose: bool = False,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    Each rank runs inside an initialised default process group (destroyed afterwards); inside
    it, ``lk.get_device()`` is the rank's device (``cuda:<rank>`` or cpu). The "auto" rule
    (``labkit.launcher.device_rule``): CUDA when there is a GPU per rank, else the CPU (said
    in a note when GPUs are there); the backend follows, ``"cpu:gloo,cuda:nccl"`` on CUDA (so
    CPU tensors still work, over gloo) and ``"gloo"`` on the CPU.

    Args:
        fn: the function every rank runs; defined anywhere, notebook cells included.
        world_size: number of ranks (processes).
        backend: ``"auto"`` (see above), ``"gloo"``, ``"nccl"`` (CUDA tensors only),
            a labkit backend name (``"labkit_shm"``, ...) or an ``lk.BackendSpec`` that
            registers a backend of your own in every rank.
        args: extra positional arguments for ``fn`` (sent to every rank by value).
        kwargs: extra keyword arguments for ``fn``.
        timeout: seconds before every rank is stopped and their stacks are reported;
            multiplied by ``LABKIT_TIMEOUT_SCALE`` on a loaded box (``lk.stretch``).
        device: ``"auto"`` (see above), ``"cpu"`` or ``"cuda"`` (rank r uses GPU r; needs one
            GPU per rank).
        verbose: also show library chatter (c10d and gloo logs, torch deprecation warnings).
        env: environment variables for this launch's ranks, set over the caller's environment
            before the process group is created, as if each rank had been started with them
            (``{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}``, ``{"TORCH_FR_BUFFER_SIZE": "100"}``).
            The caller's own environment is unchanged. Variables that a library reads only
            once when it is imported (before the ranks are forked) keep their import-time value,
            except ``TORCH_DISTRIBUTED_DEBUG``, which every rank reads again.

    Returns:
        The per-rank return values, in rank order.

    Raises:
        ValueError / RuntimeError: bad arguments, before any process starts.
        RankError: a rank raised or died; names the rank(s) and shows the traceback.
        LaunchTimeout: nothing finished within ``timeout``; shows where each rank was stuck.
        KeyboardInterrupt: re-raised after every rank has been stopped.
    """
    kwargs = dict(kwargs or {})
    if not isinstance(args, (tuple, list)):
        raise ValueError(f"args must be a tuple of extra arguments, got {type(args).__name__}")
    check_fn(fn, tuple(args), kwargs)
    plan = make_plan(world_size, backend, device, timeout, verbose, env)
    payload = pickle_call(fn, tuple(args), kwargs, plan.carrier)
    plan.import_backend_here()

    from labkit.launcher._run import LaunchRun

    with pool_lock():
        return LaunchRun(get_zygote(), plan, payload).run()
