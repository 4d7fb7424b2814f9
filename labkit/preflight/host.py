"""The doctor's host checks: cores, memory, ``/dev/shm``, loopback networking, packages.

Introduced in notebooks/00_setup_and_launcher.ipynb.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import socket
from pathlib import Path

from labkit.preflight.checks import REQUIREMENTS, Check

GIB = 1 << 30
MIN_CORES = 2
MIN_MEMORY_GIB = 4.0
MIN_SHM_GIB = 1.0
# (import name, distribution name, needed for); nbval only matters to the test suite.
JUPYTER_PACKAGES = (
    ("papermill", "papermill", "headless course runs"),
    ("nbval", "nbval", "notebook tests"),
    ("ipywidgets", "ipywidgets", "the explorers"),
    ("matplotlib", "matplotlib", "figures"),
    ("jupyterlab", "jupyterlab", "running the notebooks"),
)


def _cgroup_cpus(path: Path = Path("/sys/fs/cgroup/cpu.max")) -> float | None:
    # cgroup v2 quota, e.g. "200000 100000" = 2 CPUs (Docker's --cpus 2); "max ..." = none.
    try:
        quota, period = path.read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def usable_cores() -> tuple[int, str]:
    """How many cores this process may use, and how that was measured.

    Returns:
        ``(cores, detail)``: the least of ``os.cpu_count()``, the CPU affinity and the cgroup
        quota, with each measurement spelled out in ``detail``.
    """
    total = os.cpu_count() or 1
    parts, cores = [f"{total} cores"], total
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
        parts.append(f"{affinity} in this process's affinity")
        cores = min(cores, affinity)
    quota = _cgroup_cpus()
    if quota is not None:
        parts.append(f"cgroup quota {quota:g} CPUs")
        cores = min(cores, max(1, int(quota)))
    return cores, ", ".join(parts)


def check_cpu(n_gpus: int = 0) -> Check:
    """Count the usable cores and say which world size is sensible.

    Measured with gloo on a 2-core machine: 8 ranks work but are slow (a 1 KB all-reduce
    takes ~25 ms); 2–4 ranks is the sensible range on a laptop. NCCL takes one GPU per rank (it
    refuses two ranks on one GPU), so under NCCL a notebook's world_size is at most the number
    of GPUs; ``backend="auto"`` picks gloo on CPU when the GPUs are fewer than the ranks, and
    ``backend="nccl"`` refuses to start (labkit.launcher).

    Args:
        n_gpus: GPUs that torch can use (not merely listed by ``nvidia-smi``).

    Returns:
        "ok", or "warn" below 2 cores.
    """
    cores, detail = usable_cores()
    cpu_ranks = max(2, min(cores, 4))
    advice = f"world_size {cpu_ranks} suits this machine on CPU (2–4 ranks on a laptop)"
    if n_gpus:
        advice = (
            f"{advice}; {n_gpus} GPU(s) for NCCL, one rank per GPU: under backend='nccl' "
            f"a notebook's world_size may be at most {n_gpus}; a notebook that needs more ranks "
            "runs with backend='gloo' on CPU (backend='auto' picks it then)"
        )
    detail = f"{detail}; {advice}"
    if cores >= MIN_CORES:
        return Check("cpu", "ok", detail)
    return Check(
        "cpu",
        "warn",
        detail,
        "one core runs every rank in turn: use world_size=2 and fast=True; give the machine "
        "(or the container: `docker run --cpus 4`) at least 2 cores",
    )


def check_memory() -> Check:
    """Report total and available memory (psutil); warn below 4 GiB.

    Returns:
        "ok", or "warn" below 4 GiB or without psutil.
    """
    try:
        import psutil
    except ImportError:
        return Check("memory", "warn", "psutil not installed", "pip install psutil")
    mem = psutil.virtual_memory()
    detail = f"{mem.total / GIB:.1f} GiB total, {mem.available / GIB:.1f} GiB available"
    if mem.total >= MIN_MEMORY_GIB * GIB:
        return Check("memory", "ok", detail)
    return Check(
        "memory",
        "warn",
        detail,
        "every rank holds its own model, data and optimizer state: use world_size=2 and "
        "fast=True, close other notebooks, or give the VM/container more memory",
    )


def check_shm(n_gpus: int = 0, path: str = "/dev/shm") -> Check:
    """Check the size of ``/dev/shm``, which NCCL and torch's shared tensors live in.

    Source: NCCL docs, Troubleshooting, Docker: NCCL needs more shared memory than Docker's
    default 64 MB (``--shm-size`` or ``--ipc=host``).

    Args:
        n_gpus: GPUs found (a small ``/dev/shm`` breaks NCCL, so the wording gets stronger).
        path: the shared-memory mount (a parameter so tests can point elsewhere).

    Returns:
        "ok" (also where there is no ``/dev/shm``, as on macOS), or "warn" below 1 GiB.
    """
    if not os.path.isdir(path):
        return Check("/dev/shm", "ok", f"no {path} on this system (macOS?): nothing to check")
    usage = shutil.disk_usage(path)
    detail = f"{usage.total / GIB:.2f} GiB ({usage.free / GIB:.2f} GiB free)"
    if usage.total >= MIN_SHM_GIB * GIB:
        return Check("/dev/shm", "ok", detail)
    if n_gpus:
        fix = (
            "NCCL will crash or hang with this little shared memory (Docker's default is "
            "64 MB): restart the container with `--ipc=host` or `--shm-size=8g`"
        )
    else:
        fix = (
            "enough for gloo on CPU, but DataLoader workers and NCCL need more: in Docker "
            "use `--shm-size=1g` (or `--ipc=host`)"
        )
    return Check("/dev/shm", "warn", detail, fix)


def check_loopback() -> Check:
    """Check that the loopback interface (``lo`` or ``lo0``) exists; the ranks talk over it.

    labkit's launcher keeps its store on 127.0.0.1 and gloo on ``GLOO_SOCKET_IFNAME=lo``.

    Returns:
        "ok" when present, "fail" when missing.
    """
    try:
        names = [name for _, name in socket.if_nameindex()]
    except (OSError, AttributeError) as exc:
        return Check("loopback", "warn", f"cannot list network interfaces: {exc}")
    found = [name for name in names if name in ("lo", "lo0")]
    if found:
        return Check("loopback", "ok", f"{found[0]} present ({len(names)} interfaces)")
    return Check(
        "loopback",
        "fail",
        f"no lo/lo0 among {', '.join(names) or 'no interfaces'}",
        "the ranks rendezvous on 127.0.0.1: bring it up (`ip link set lo up`); in a container, "
        "do not use `--network none`",
    )


def _bind_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        return sock.getsockname()[1]


def check_tcp_port() -> Check:
    """Check that a free TCP port on 127.0.0.1 can be bound (where labkit's store listens).

    Returns:
        "ok" with the port the OS gave, or "fail" when binding raises.
    """
    try:
        port = _bind_loopback_port()
    except OSError as exc:
        return Check(
            "tcp port",
            "fail",
            f"cannot bind 127.0.0.1: {exc}",
            "the launcher's rendezvous listens on 127.0.0.1: check the loopback interface "
            "and any sandbox or firewall that forbids listening sockets",
        )
    return Check("tcp port", "ok", f"bound 127.0.0.1:{port}")


def _pins(requirements: Path = REQUIREMENTS) -> dict[str, str]:
    pins: dict[str, str] = {}
    for sibling in (requirements, requirements.with_name("requirements-dev.txt")):
        try:
            lines = sibling.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            name, sep, version = line.split("#")[0].strip().partition("==")
            if sep:
                pins[name.strip().lower()] = version.strip()
    return pins


def check_jupyter() -> Check:
    """Check that the notebook tooling imports: papermill, nbval, ipywidgets, matplotlib, lab.

    Returns:
        "ok" when all are installed, else "warn" naming the missing ones.
    """
    found, missing = [], []
    for module, dist, _ in JUPYTER_PACKAGES:
        if importlib.util.find_spec(module) is None:
            missing.append((module, dist))
            continue
        try:
            found.append(f"{module} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(module)
    detail = ", ".join(found) or "none installed"
    if not missing:
        return Check("jupyter", "ok", detail)
    pins = _pins()
    install = " ".join(f"'{dist}=={pins[dist]}'" if dist in pins else dist for _, dist in missing)
    uses = {module: use for module, _, use in JUPYTER_PACKAGES}
    lacking = "; ".join(f"{m} missing ({uses[m]})" for m, _ in missing)
    return Check("jupyter", "warn", f"{lacking}; {detail}", f"pip install {install}")


def check_compiler() -> Check:
    """Look for a C++ compiler (a later notebook builds a small C++ backend).

    Returns:
        "ok" with its path, or "warn" when neither ``g++`` nor ``c++`` is on PATH.
    """
    for name in ("g++", "c++"):
        path = shutil.which(name)
        if path:
            return Check("c++ compiler", "ok", path)
    return Check(
        "c++ compiler",
        "warn",
        "no g++ or c++ on PATH (needed only by the C++ backend notebook)",
        "Debian/Ubuntu: `apt-get install g++`; macOS: `xcode-select --install`; conda: "
        "`conda install -c conda-forge cxx-compiler`",
    )
