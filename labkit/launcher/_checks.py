"""Check a launch request before any process starts; every error says what to do instead.

Introduced in notebooks/00_setup_and_launcher.ipynb.
"""

from __future__ import annotations

import inspect
import math
import os
import socket
import sys
from dataclasses import dataclass

from labkit.backends.names import LABKIT_BACKENDS, available_labkit_backends
from labkit.launcher._backend_spec import BackendSpec
from labkit.launcher.device_rule import MULTI_DEVICE, Choice, choose
from labkit.launcher.launch_log import note_launch
from labkit.launcher.stretch import timeout_scale

BUILTIN_BACKENDS = ("gloo", "nccl", "mpi", "ucc", "xccl")


@dataclass(frozen=True)
class Plan:
    world_size: int
    # The backend, in one value that travels to the ranks with the call: a builtin's name, or
    # the BackendSpec that names and registers a non-builtin one (labkit's or the learner's).
    carrier: str | BackendSpec
    device: str  # may contain "{rank}", filled in by each rank
    threads: int  # torch intra-op threads per rank
    timeout: float
    pg_timeout: float  # longer than timeout, so the launcher's diagnosis (with stacks) wins
    loopback_if: str | None
    verbose: bool
    env: tuple[tuple[str, str], ...] = ()  # set in every rank over the caller's environment

    @property
    def backend(self) -> str:
        """The name ``init_process_group`` gets."""
        return backend_name(self.carrier)

    @property
    def backend_spec(self) -> BackendSpec | None:
        """The spec that registers a non-builtin backend, or None for a builtin one."""
        return self.carrier if isinstance(self.carrier, BackendSpec) else None

    def import_backend_here(self) -> None:
        """Import a non-builtin backend's module in the kernel too, before the ranks start.

        One that builds something (the C++ backend compiles on first use) does it once, not
        in every rank under the timeout.
        """
        spec = self.backend_spec
        if spec is not None and spec.module:
            import importlib

            importlib.import_module(spec.module)


def backend_name(carrier: str | BackendSpec) -> str:
    """The backend name of a plan's carrier (lower case, as ``init_process_group`` uses it)."""
    return (carrier.name if isinstance(carrier, BackendSpec) else carrier).lower()


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


def check_env(env) -> tuple[tuple[str, str], ...]:
    """Validate ``lk.launch(env=...)``: a mapping of environment variable names to strings."""
    if env is None:
        return ()
    if not hasattr(env, "items"):
        raise ValueError(f"env must be a dict of variable names to strings, got {env!r}")
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or not isinstance(value, str):
            raise ValueError(
                f"env entries must be str -> str (a name without '='), got {key!r}: {value!r}; "
                'write numbers as strings, e.g. env={"TORCH_FR_BUFFER_SIZE": "100"}'
            )
    return tuple(sorted(env.items()))


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
    """GPUs visible here, counted without initialising CUDA in this (the kernel's) process."""
    from labkit.launcher._gpus import gpu_count

    return gpu_count()


def resolve(backend, device, world_size: int) -> tuple[str, BackendSpec | None, str]:
    """The backend to initialise, the spec that registers it in the ranks, the device template.

    ``labkit.launcher.device_rule`` holds the rule; this adds the checks of names and of
    ``BackendSpec``s (which serve the device types they declare).
    """
    if not isinstance(device, str):
        device = str(device)
    if isinstance(backend, BackendSpec):
        return backend.name.lower(), backend, _spec_device(backend, device, world_size)
    import torch.distributed as dist

    name = _check_name(backend)
    choice = choose(name, device, world_size, _gpu_count(), dist.is_nccl_available())
    if choice.note:
        _say_once(choice.note)
    template = "cuda:{rank}" if choice.device == "cuda" else "cpu"
    if choice.backend in LABKIT_BACKENDS:
        module = LABKIT_BACKENDS[choice.backend]
        return choice.backend, BackendSpec(choice.backend, module=module), template
    return choice.backend, None, template


def launch_choice(world_size: int, backend: str = "auto", device: str = "auto") -> Choice:
    """What ``lk.launch(fn, world_size, backend=..., device=...)`` would run on, here and now.

    For code that must know before it launches: e.g. a wrapping backend (``recording.spec(inner)``)
    needs one inner backend, ``labkit.launcher._context.backend_for(choice.backend,
    choice.device)``.

    Args:
        world_size: ranks of the launch.
        backend: a backend name (``"auto"``, ``"gloo"``, ``"nccl"``, a labkit one).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.

    Returns:
        The ``device_rule.Choice`` (its note unprinted).

    Raises:
        ValueError / RuntimeError: as ``lk.launch`` would, before starting anything.
    """
    import torch.distributed as dist

    name = _check_name(backend)
    return choose(name, device, world_size, _gpu_count(), dist.is_nccl_available())


def fit_ranks(
    world_size: int,
    backend: str = "auto",
    device: str = "auto",
    *,
    at_least: int = 1,
    multiple_of: int = 1,
    why: str = "",
) -> tuple[int, str, str]:
    """A notebook's world size, backend and device, fitted to what its lesson and machine allow.

    Every notebook's parameter cell calls it, so that ``labkit course run --world-size N --device
    cuda`` runs the whole course on any machine and says where it had to differ:

    - a lesson that needs more ranks (a parameter server and two workers: 3) or a multiple
      (a 2-D mesh: even) launches the next world size that fits, and says so;
    - NCCL needs one GPU per rank: asked for CUDA (``device="cuda"`` or ``backend="nccl"``)
      with fewer GPUs than ranks, the lesson runs on CPU ranks over gloo, and says so.
      "auto" is left to the launcher, which decides the same way for each launch
      (``labkit.launcher.device_rule``).

    Args:
        world_size: the notebook's ``world_size`` parameter (at least 1).
        backend: the notebook's ``backend`` parameter.
        device: the notebook's ``device`` parameter.
        at_least: the fewest ranks the lesson can show its point with.
        multiple_of: the world size must be a multiple of this.
        why: the lesson's reason, shown in the note (e.g. "2-D meshes need an even size").

    Returns:
        ``(world_size, backend, device)`` to launch with.

    Raises:
        ValueError: a world size that is not a positive integer.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    fitted = max(world_size, at_least)
    fitted += -fitted % multiple_of
    if fitted != world_size:
        reason = f"{why}: " if why else ""
        print(
            f"note: {reason}launching {fitted} ranks instead of world_size={world_size}",
            file=sys.stderr,
            flush=True,
        )
    wants_gpu = device == "cuda" or str(backend).lower() == "nccl"
    gpus = _gpu_count() if wants_gpu else 0
    if not wants_gpu or gpus >= fitted:
        return fitted, backend, device
    cpu_backend = "gloo" if str(backend).lower() in ("auto", "nccl", MULTI_DEVICE) else backend
    print(
        f"note: this lesson runs {fitted} ranks and NCCL needs one GPU per rank, but "
        f"{gpus} GPU(s) are visible: its ranks run on the CPU over {cpu_backend} "
        f"(device='cpu')"
        if gpus
        else f"note: device={device!r}/backend={backend!r} asked for, but no GPU is visible: "
        f"the ranks run on the CPU over {cpu_backend}",
        file=sys.stderr,
        flush=True,
    )
    return fitted, cpu_backend, "cpu"


def _spec_device(spec: BackendSpec, device: str, world_size: int) -> str:
    served = tuple(spec.devices)
    if device == "auto":
        device = "cpu" if "cpu" in served else "cuda"
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if device not in served:
        raise ValueError(
            f"backend {spec.name!r} serves {', '.join(served)} tensors only (its BackendSpec's "
            f"devices), not device={device!r}"
        )
    if device == "cuda":
        gpus = _gpu_count()
        if gpus < world_size:
            raise RuntimeError(
                f"backend {spec.name!r} on CUDA puts rank r on GPU r: world_size={world_size} "
                f"needs {world_size} GPUs, this machine has {gpus}. Use fewer ranks."
            )
        return "cuda:{rank}"
    return "cpu"


_said: set[str] = set()


def _say_once(note: str) -> None:
    """Print a note about what "auto" chose once per process (a notebook launches often)."""
    if note not in _said:
        _said.add(note)
        print(f"note: {note}", file=sys.stderr, flush=True)


def _check_name(backend) -> str:
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
    if name in ("auto", MULTI_DEVICE):
        return "auto"  # the multi-device string is what "auto" chooses on GPUs
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
    if name == "gloo" and not dist.is_gloo_available():
        raise RuntimeError("this PyTorch build has no gloo backend; reinstall torch")
    return name


def make_plan(world_size, backend, device, timeout, verbose, env=None) -> Plan:
    world_size = check_world_size(world_size)
    env = check_env(env)
    if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0:
        raise ValueError(
            f"timeout must be a positive number of seconds, got {timeout!r}: every launch "
            "has a deadline, so a deadlock ends with a diagnosis instead of a hang"
        )
    name, spec, device = resolve(backend, device, world_size)
    carrier = name if spec is None else spec
    scale = timeout_scale()  # a loaded box (a workshop room) stretches every deadline
    threads = max(1, (os.cpu_count() or 1) // world_size)
    note_launch(backend_name(carrier), device, world_size)  # what "auto" became, for the report
    return Plan(
        world_size,
        carrier,
        device,
        threads,
        float(timeout) * scale,
        (float(timeout) + 60.0) * scale,
        loopback_interface(),
        bool(verbose),
        env,
    )
