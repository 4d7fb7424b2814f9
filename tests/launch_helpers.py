"""Shared helpers for the launcher tests: find labkit's processes, run scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def owned_processes(launcher_pid: int | None = None) -> list[psutil.Process]:
    """labkit processes (zygote and ranks) started by ``launcher_pid`` (default: this process).

    Found by their titles, so a rank that escaped its parent (re-parented to init) still counts.
    """
    launcher_pid = os.getpid() if launcher_pid is None else launcher_pid
    tag = f"launcher pid {launcher_pid}"
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cmd.startswith("labkit ") and tag in cmd:
            found.append(p)
    return found


def ranks_of(launcher_pid: int | None = None) -> list[psutil.Process]:
    return [p for p in owned_processes(launcher_pid) if "labkit rank" in " ".join(p.cmdline())]


def wait_until(predicate, timeout: float = 10.0, step: float = 0.05) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def run_script(code: str, timeout: float = 120.0, **kwargs) -> subprocess.CompletedProcess:
    """Run ``code`` as a plain Python script with this interpreter."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kwargs,
    )
