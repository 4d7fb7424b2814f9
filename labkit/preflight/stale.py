"""Find (and optionally stop) labkit processes whose owning kernel is gone.

Introduced in notebooks/00_setup_and_launcher.ipynb.

labkit's launcher titles its processes with setproctitle: the warm worker is
``labkit zygote (launcher pid N)`` and each rank ``labkit rank R/W (launch K, launcher pid N)``.
A kernel that was killed hard, or a rank stuck in the kernel, can leave them behind, holding
cores, memory or a GPU.

A process is *stale* only when the kernel (or script) that owns it is gone — never because it
belongs to another kernel. On a shared machine (a workshop room with one user for several
learners, or one learner with two notebooks open) the other kernels' workers are alive and
owned; the doctor lists them as left alone and ``--kill-stale`` never touches them. Ownership
follows the parent chain, which a recycled pid cannot fake:

- a zygote is the direct child of its launcher (``subprocess.Popen``): it is owned while its
  parent is still the launcher its title names. A launcher that exits leaves it re-parented (to
  init, ``tini`` or a subreaper), and then it is stale even if a new process got the old pid;
- a rank is forked by a zygote and owned while that zygote is; a rank whose zygote is gone
  falls back to its title's launcher pid (and a rank titled without one, to its parent), alive
  only if that process started before the rank did (a recycled pid is younger than the rank).

Only the current user's processes are considered, and never this process's own zygote and
ranks.
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

    @property
    def stale(self) -> bool:
        """True when its owner is gone (or unknown): nobody will stop it but the doctor."""
        return not self.owner_alive

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


def _is_zygote(title: str) -> bool:
    return title.startswith("labkit zygote")


def _owner(pid: int, found: dict[int, tuple[Any, str]], now: float) -> tuple[int | None, bool]:
    """(owner pid, alive) of a labkit process, following its parent chain (see the module)."""
    proc, title = found[pid]
    ppid = proc.info.get("ppid") or 0
    started = proc.info.get("create_time") or now
    launcher = _launcher_pid(title)
    if _is_zygote(title):
        # Popen made it the launcher's child: a different parent means the launcher exited.
        return launcher, launcher is not None and ppid == launcher and _alive(launcher, started)
    if ppid in found and _is_zygote(found[ppid][1]):
        return _owner(ppid, found, now)  # a rank is owned while its zygote is
    owner = launcher if launcher is not None else (ppid if ppid > 1 else None)
    return owner, owner is not None and _alive(owner, started)


def find_labkit_processes() -> list[LabkitProcess]:
    """List this user's labkit zygotes and ranks that do not belong to this process.

    Each carries its owner and whether that owner is alive (another kernel's live worker) or
    gone (stale). This process's own zygote and ranks are left out.

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
    now, result = time.time(), []
    for pid, (proc, title) in sorted(found.items()):
        owner, alive = _owner(pid, found, now)
        if owner == me and alive:  # this process's zygote, its ranks, or a rank it started
            continue
        started = proc.info.get("create_time") or now
        result.append(LabkitProcess(pid, title, now - started, owner, alive, proc))
    return result


def find_stale_processes() -> list[LabkitProcess]:
    """List this user's labkit zygotes and ranks whose owning kernel is gone.

    A live kernel's worker is never stale, whoever's kernel it is.

    Returns:
        One :class:`LabkitProcess` per stale process, ordered by pid.

    Raises:
        ImportError: psutil is not installed.
    """
    return [p for p in find_labkit_processes() if p.stale]


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
    """Report labkit processes whose owner is gone, and stop them if ``kill``.

    Workers of other live kernels (another notebook, another learner on a shared account) are
    named in the detail as left alone, and never stopped.

    Args:
        kill: terminate the stale ones (``labkit doctor --kill-stale``).

    Returns:
        "ok" when there are none (or all were stopped), else "warn" with the ``kill`` command.
    """
    try:
        procs = find_labkit_processes()
    except ImportError:
        return Check("stale processes", "warn", "psutil not installed", "pip install psutil")
    stale = [p for p in procs if p.stale]
    live = [p for p in procs if not p.stale]
    spared = ""
    if live:
        owners = sorted({p.owner_pid for p in live if p.owner_pid is not None})
        spared = (
            f"left alone: {len(live)} labkit process(es) of {len(owners)} other live "
            f"kernel(s) (pid {', '.join(str(o) for o in owners)}); they stop with their kernel"
        )
    if not stale:
        detail = "no labkit zygote or rank whose kernel is gone"
        return Check("stale processes", "ok", "\n".join(filter(None, [detail, spared])))
    if kill:
        survivors = kill_processes(stale)
        lines = [
            f"{'still alive' if p.pid in survivors else 'stopped'} {p.describe()}" for p in stale
        ]
        detail = "\n".join(filter(None, [*lines, spared]))
        if not survivors:
            return Check("stale processes", "ok", detail)
        pids = " ".join(str(pid) for pid in survivors)
        return Check("stale processes", "warn", detail, f"still alive: `kill -9 {pids}`")
    detail = "\n".join(filter(None, [*(p.describe() for p in stale), spared]))
    pids = " ".join(str(p.pid) for p in stale)
    fix = f"`kill {pids}` (or `labkit doctor --kill-stale`, which stops only these)"
    return Check("stale processes", "warn", detail, fix)
