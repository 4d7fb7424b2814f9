"""Tests for labkit.preflight.stale with real processes titled like labkit's.

Never runs the kill path over every process on the machine (others may be running labkit
too): the kill tests restrict the doctor's scan to the processes they started.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import psutil
import pytest

from labkit.preflight import stale as stale

TITLED = "import setproctitle, sys, time\nsetproctitle.setproctitle(sys.argv[1])\ntime.sleep(120)\n"
doctor_mod = importlib.import_module("labkit.preflight")  # the module, whatever lk.doctor is
# A fake zygote: titles itself, then forks a titled rank that sleeps (like labkit's zygote).
ZYGOTE = (
    "import os, setproctitle, sys, time\n"
    "setproctitle.setproctitle(sys.argv[1])\n"
    "if os.fork() == 0:\n"
    "    setproctitle.setproctitle(sys.argv[2])\n"
    "time.sleep(120)\n"
)


def wait_for_title(pid: int, title: str, n_children: int = 0) -> psutil.Process:
    proc = psutil.Process(pid)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        ready = stale.title_of(proc.cmdline()) == title
        if ready and len(proc.children()) >= n_children:
            return proc
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never took the title {title!r}")


@pytest.fixture
def spawn() -> Iterator:
    started: list[subprocess.Popen] = []

    def start(code: str, *titles: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code, *titles])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        for member in family:
            member.kill()
        proc.kill()
        proc.wait()


def only(monkeypatch, *pids: int) -> None:
    """Restrict the doctor's scan to these processes (and their children)."""
    real = stale._candidates
    wanted = set(pids)
    for pid in pids:
        wanted |= {child.pid for child in psutil.Process(pid).children(recursive=True)}
    monkeypatch.setattr(stale, "_candidates", lambda: [p for p in real() if p.pid in wanted])


def test_title_and_age_formatting():
    assert stale.title_of(["labkit rank 1/2 (launch 9)", "", ""]) == "labkit rank 1/2 (launch 9)"
    assert stale.title_of(None) == ""
    assert [stale.format_age(s) for s in (5, 185, 9000, 200000)] == [
        "5 s",
        "3 min",
        "2.5 h",
        "2.3 d",
    ]


def test_finds_a_leftover_rank_and_kill_stale_ends_it(spawn, monkeypatch):
    title = "labkit rank 1/2 (launch 9)"
    proc = spawn(TITLED, title)
    wait_for_title(proc.pid, title)

    found = {p.pid: p for p in stale.find_stale_processes()}  # a real scan, read-only
    assert found[proc.pid].title == title
    assert found[proc.pid].owner_pid == os.getpid()  # its parent: this test process
    assert found[proc.pid].owner_alive

    only(monkeypatch, proc.pid)
    check = stale.check_stale()
    assert check.status == "warn"
    assert f"pid {proc.pid}: '{title}'" in check.detail
    assert f"`kill {proc.pid}`" in check.fix

    report = doctor_mod.doctor(kill_stale=True)
    assert report["stale processes"].status == "ok"
    assert report["stale processes"].detail.startswith(f"stopped pid {proc.pid}")
    assert proc.wait(timeout=10) is not None
    assert not any(p.pid == proc.pid for p in stale.find_stale_processes())


def test_own_zygote_and_its_ranks_are_not_stale(spawn):
    zygote_title = f"labkit zygote (launcher pid {os.getpid()})"
    rank_title = "labkit rank 0/2 (launch 1)"
    proc = spawn(ZYGOTE, zygote_title, rank_title)
    zygote = wait_for_title(proc.pid, zygote_title, n_children=1)
    rank = zygote.children()[0]
    wait_for_title(rank.pid, rank_title)
    pids = {p.pid for p in stale.find_stale_processes()}
    assert proc.pid not in pids and rank.pid not in pids


def test_orphaned_zygote_reports_its_dead_launcher(spawn, monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    zygote_title = f"labkit zygote (launcher pid {gone.pid})"
    rank_title = "labkit rank 1/2 (launch 3)"
    proc = spawn(ZYGOTE, zygote_title, rank_title)
    zygote = wait_for_title(proc.pid, zygote_title, n_children=1)
    rank = zygote.children()[0]
    wait_for_title(rank.pid, rank_title)

    only(monkeypatch, proc.pid)
    found = {p.pid: p for p in stale.find_stale_processes()}
    assert set(found) == {proc.pid, rank.pid}
    for pid in (proc.pid, rank.pid):  # the rank's owner is its zygote's launcher
        assert (found[pid].owner_pid, found[pid].owner_alive) == (gone.pid, False)
    assert f"owner pid {gone.pid} gone" in found[rank.pid].describe()

    check = stale.check_stale(kill=True)
    assert check.status == "ok"
    assert proc.wait(timeout=10) is not None
    assert not psutil.pid_exists(rank.pid) or rank.status() == psutil.STATUS_ZOMBIE
