"""Find (and optionally stop) labkit processes left over from earlier runs.

Introduced in notebooks/00_setup_and_launcher.ipynb.

labkit's launcher titles its processes with setproctitle: the warm worker is
``labkit zygote (launcher pid N)`` and each rank ``labkit rank R/W (launch K, ...)``. A kernel
that was killed hard, or a rank stuck in the kernel, can leave them behind, holding cores,
memory or a GPU. Only the current user's processes are considered, and never the ones that
belong to this process (its own zygote and that zygote's ranks).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from labkit.preflight.checks import Check

TITLE_PREFIXES = ("labkit zygote", "labkit rank")
_LAUNCHER_PID = re.compile(r"launcher pid (\d+)")


@dataclass(frozen=True)
class LabkitProcess:
    """A labkit zygote or rank that does not belong to this process."""

    pid: int
    title: str
    age_s: float
    owner_pid: int | None  # the kernel or script that launched it, when known
    owner_alive: bool
    process: Any = field(default=None, compare=False, repr=False)  # the psutil.Process

    def describe(self) -> str:
        """One line: pid, title, age and owner, e.g. for the doctor's table."""
        if self.owner_pid is None:
            owner = "owner unknown (orphaned)"
        else:
            owner = f"owner pid {self.owner_pid} {'alive' if self.owner_alive else 'gone'}"
        return f"pid {self.pid}: {self.title!r}, up {format_age(self.age_s)}, {owner}"


def format_age(seconds: float) -> str:
    """Format an age for people.

    Args:
        seconds: the age.

    Returns:
        ``42 s``, ``3 min``, ``2.5 h`` or ``4.0 d``.
    """
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def title_of(cmdline: list[str] | None) -> str:
    """The process title from psutil's cmdline.

    Args:
        cmdline: ``psutil.Process.cmdline()``; setproctitle pads it with empty parts.

    Returns:
        The parts joined by spaces, e.g. ``"labkit rank 1/2 (launch 9)"``.
    """
    return " ".join(part for part in cmdline or [] if part).strip()


def _launcher_pid(title: str) -> int | None:
    match = _LAUNCHER_PID.search(title)
    return int(match.group(1)) if match else None


def _candidates() -> Iterable[Any]:
    import psutil

    attrs = ["pid", "ppid", "cmdline", "create_time", "uids"]
    return psutil.process_iter(attrs, ad_value=None)


def _alive(pid: int, child_started: float) -> bool:
    import psutil

    try:
        # A pid recycled after the owner died belongs to a process younger than its "child".
        return psutil.Process(pid).create_time() <= child_started + 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def find_stale_processes() -> list[LabkitProcess]:
    """List labkit zygotes and ranks of this user that do not belong to this process.

    Returns:
        One :class:`LabkitProcess` per process, ordered by pid.

    Raises:
        ImportError: psutil is not installed.
    """
    me = os.getpid()
    uid = os.getuid() if hasattr(os, "getuid") else None
    found: dict[int, tuple[Any, str]] = {}
    for proc in _candidates():
        title = title_of(proc.info.get("cmdline"))
        if not title.startswith(TITLE_PREFIXES) or proc.pid == me:
            continue
        uids = proc.info.get("uids")
        if uid is not None and uids is not None and uids.real != uid:
            continue
        found[proc.pid] = (proc, title)
    own = {  # this process's zygote (its ranks are skipped below, as the zygote's children)
        pid
        for pid, (_, title) in found.items()
        if title.startswith("labkit zygote") and _launcher_pid(title) == me
    }
    now, result = time.time(), []
    for pid, (proc, title) in sorted(found.items()):
        ppid = proc.info.get("ppid") or 0
        if pid in own or ppid in own:
            continue
        owner = _launcher_pid(title)
        if owner == me:  # a rank of this process's launcher, whose zygote was not found
            continue
        if owner is None and title.startswith("labkit rank"):
            if ppid in found:  # forked by a zygote: its launcher owns the rank
                owner = _launcher_pid(found[ppid][1])
            elif ppid > 1:
                owner = ppid
        started = proc.info.get("create_time") or now
        alive = owner is not None and _alive(owner, started)
        result.append(LabkitProcess(pid, title, now - started, owner, alive, proc))
    return result


def kill_processes(procs: list[LabkitProcess], timeout: float = 3.0) -> list[int]:
    """Terminate the given processes (SIGTERM, then SIGKILL after ``timeout`` seconds).

    Args:
        procs: from :func:`find_stale_processes` (psutil guards against recycled pids).
        timeout: seconds to wait after SIGTERM before SIGKILL.

    Returns:
        The pids still alive afterwards (normally none; e.g. another user's process).
    """
    import psutil

    handles = [p.process for p in procs if p.process is not None]
    for handle in handles:
        try:
            handle.terminate()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _, alive = psutil.wait_procs(handles, timeout=timeout)
    for handle in alive:
        try:
            handle.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    _, alive = psutil.wait_procs(alive, timeout=timeout)
    return sorted(handle.pid for handle in alive)


def check_stale(kill: bool = False) -> Check:
    """Report labkit processes not owned by this process, and stop them if ``kill``.

    Args:
        kill: terminate them (``labkit doctor --kill-stale``).

    Returns:
        "ok" when there are none (or all were stopped), else "warn" with the ``kill`` command.
    """
    try:
        procs = find_stale_processes()
    except ImportError:
        return Check("stale processes", "warn", "psutil not installed", "pip install psutil")
    if not procs:
        return Check("stale processes", "ok", "no labkit zygote or rank from another run")
    detail = "\n".join(p.describe() for p in procs)
    if kill:
        survivors = kill_processes(procs)
        detail = "\n".join(
            f"{'still alive' if p.pid in survivors else 'stopped'} {p.describe()}" for p in procs
        )
        if not survivors:
            return Check("stale processes", "ok", detail)
        pids = " ".join(str(pid) for pid in survivors)
        return Check("stale processes", "warn", detail, f"still alive: `kill -9 {pids}`")
    pids = " ".join(str(p.pid) for p in procs)
    live_owners = sorted({p.owner_pid for p in procs if p.owner_alive and p.owner_pid})
    fix = f"`kill {pids}` (or `labkit doctor --kill-stale`)"
    if live_owners:
        owners = ", ".join(str(pid) for pid in live_owners)
        runs = "owner {} still runs" if len(live_owners) == 1 else "owners {} still run"
        fix += f"; {runs.format(owners)}: `lk.shutdown()` in a kernel stops its worker"
    else:
        fix += "; a kernel stops its own worker with `lk.shutdown()`"
    return Check("stale processes", "warn", detail, fix)
