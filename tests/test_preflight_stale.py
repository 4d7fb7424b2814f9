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


# A fake kernel: starts the program argv[1] as its worker, titled for it (argv[3] overrides
# the zygote's title), prints the worker's pid, then lives ("live") or exits ("orphan").
KERNEL = (
    "import os, subprocess, sys, time\n"
    "me = os.getpid()\n"
    "if sys.argv[2] == 'titled-child':\n"
    "    titles = ['labkit rank 1/2 (launch 9)']\n"
    "else:\n"
    "    zygote = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else ''\n"
    "    titles = [zygote or f'labkit zygote (launcher pid {me})',\n"
    "              f'labkit rank 0/1 (launch 1, launcher pid {me})']\n"
    "code = sys.argv[1] if sys.argv[2] != 'titled-child' else "
    "'import setproctitle, sys, time; setproctitle.setproctitle(sys.argv[1]); time.sleep(120)'\n"
    "child = subprocess.Popen([sys.executable, '-c', code, *titles])\n"
    "print(child.pid, flush=True)\n"
    "if sys.argv[2] != 'orphan':\n"
    "    time.sleep(120)\n"
)
# Another kernel with a real labkit zygote: prints its pid, then waits to be killed.
REAL_KERNEL = (
    "import time\n"
    "from labkit.launcher._pool import get_zygote\n"
    "print(get_zygote().pid, flush=True)\n"
    "time.sleep(120)\n"
)


@pytest.fixture
def spawn() -> Iterator:
    started: list[subprocess.Popen] = []
    extra: list[int] = []

    def start(code: str, *titles: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, *titles], stdout=subprocess.PIPE, text=True
        )
        started.append(proc)
        return proc

    start.track = lambda *pids: extra.extend(pids)  # processes no longer below one we started
    yield start
    family = []
    for proc in started:
        try:
            family += psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    for pid in extra:
        try:
            family.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    for proc in started:
        proc.kill()
        proc.wait()
        proc.stdout.close()


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


def test_a_rank_whose_launcher_is_gone_is_stale_and_kill_stale_ends_it(spawn, monkeypatch):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    title = f"labkit rank 1/2 (launch 9, launcher pid {gone.pid})"
    proc = spawn(TITLED, title)
    wait_for_title(proc.pid, title)

    found = {p.pid: p for p in stale.find_stale_processes()}  # a real scan, read-only
    assert found[proc.pid].title == title
    assert (found[proc.pid].owner_pid, found[proc.pid].owner_alive) == (gone.pid, False)

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


def test_a_rank_of_a_live_owner_is_not_stale(spawn, monkeypatch):
    """Titled without a launcher pid, a rank belongs to its parent: here a live process."""
    owner = spawn(KERNEL, ZYGOTE, "titled-child")
    child_pid = int(owner.stdout.readline())
    title = "labkit rank 1/2 (launch 9)"
    wait_for_title(child_pid, title)
    procs = {p.pid: p for p in stale.find_labkit_processes()}
    assert (procs[child_pid].owner_pid, procs[child_pid].owner_alive) == (owner.pid, True)
    assert child_pid not in {p.pid for p in stale.find_stale_processes()}


def test_own_zygote_and_its_ranks_are_not_listed(spawn):
    zygote_title = f"labkit zygote (launcher pid {os.getpid()})"
    rank_title = "labkit rank 0/2 (launch 1)"
    proc = spawn(ZYGOTE, zygote_title, rank_title)
    zygote = wait_for_title(proc.pid, zygote_title, n_children=1)
    rank = zygote.children()[0]
    wait_for_title(rank.pid, rank_title)
    pids = {p.pid for p in stale.find_labkit_processes()}
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


def test_a_zygote_whose_launcher_pid_was_recycled_is_still_stale(spawn, monkeypatch):
    """The title names a live process (this one), but the zygote is not its child: the
    launcher that started it has exited, whoever holds its pid now."""
    title = f"labkit zygote (launcher pid {os.getpid()})"
    kernel = spawn(KERNEL, ZYGOTE, "orphan", title)
    zygote_pid = int(kernel.stdout.readline())
    kernel.wait(timeout=30)
    zygote = wait_for_title(zygote_pid, title, n_children=1)
    assert zygote.ppid() != os.getpid()
    only(monkeypatch, zygote_pid)
    found = {p.pid: p for p in stale.find_stale_processes()}
    assert zygote_pid in found and found[zygote_pid].owner_pid == os.getpid()


def test_kill_stale_spares_a_live_peer_kernel_and_stops_only_the_orphan(spawn, monkeypatch):
    """Issue 17: two live kernels of the same user, each owning a zygote with a rank, and one
    zygote (with its rank) whose kernel has exited. The check from kernel A (this process)
    lists only the orphan; --kill-stale stops only the orphan."""
    me = os.getpid()
    mine = spawn(  # kernel A's own worker: a zygote of this process, as lk.launch starts it
        ZYGOTE,
        f"labkit zygote (launcher pid {me})",
        f"labkit rank 0/1 (launch 1, launcher pid {me})",
    )
    peer = spawn(KERNEL, ZYGOTE, "live")  # kernel B: another live kernel of this user
    orphan_kernel = spawn(KERNEL, ZYGOTE, "orphan")  # kernel C: exits at once
    a_zygote = mine.pid
    b_zygote, c_zygote = int(peer.stdout.readline()), int(orphan_kernel.stdout.readline())
    orphan_kernel.wait(timeout=30)
    zygotes = {}
    for pid, owner in ((a_zygote, me), (b_zygote, peer.pid), (c_zygote, orphan_kernel.pid)):
        zygotes[pid] = wait_for_title(pid, f"labkit zygote (launcher pid {owner})", n_children=1)
    ranks = {pid: z.children()[0].pid for pid, z in zygotes.items()}
    spawn.track(c_zygote, ranks[c_zygote])

    only(monkeypatch, a_zygote, peer.pid, c_zygote)
    procs = {p.pid: p for p in stale.find_labkit_processes()}
    assert set(procs) == {b_zygote, ranks[b_zygote], c_zygote, ranks[c_zygote]}
    assert {p.pid for p in procs.values() if p.stale} == {c_zygote, ranks[c_zygote]}
    assert procs[b_zygote].owner_pid == peer.pid and procs[b_zygote].owner_alive

    check = stale.check_stale()
    assert check.status == "warn"
    assert f"pid {c_zygote}:" in check.detail and f"pid {b_zygote}:" not in check.detail
    assert f"left alone: 2 labkit process(es) of 1 other live kernel(s) (pid {peer.pid})" in (
        check.detail
    )
    assert f"`kill {c_zygote} {ranks[c_zygote]}`" in check.fix

    check = stale.check_stale(kill=True)
    assert check.status == "ok", check
    for pid in (c_zygote, ranks[c_zygote]):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    for pid in (a_zygote, ranks[a_zygote], b_zygote, ranks[b_zygote]):
        assert psutil.Process(pid).status() != "zombie", f"pid {pid} of a live kernel was hit"
    assert stale.check_stale().detail.startswith("no labkit zygote or rank whose kernel is gone")


@pytest.mark.slow
def test_a_real_zygote_of_another_live_kernel_is_left_alone(spawn, monkeypatch):
    """A real labkit zygote (torch imported, PDEATHSIG armed) started by another kernel."""
    kernel = spawn(REAL_KERNEL)
    zygote_pid = int(kernel.stdout.readline())
    only(monkeypatch, kernel.pid)
    procs = {p.pid: p for p in stale.find_labkit_processes()}
    assert procs[zygote_pid].title == f"labkit zygote (launcher pid {kernel.pid})"
    assert procs[zygote_pid].owner_alive and not procs[zygote_pid].stale
    assert stale.check_stale(kill=True).status == "ok"
    assert psutil.Process(zygote_pid).is_running()
    kernel.kill()  # the kernel dies: its zygote follows (parent-death signal)
    kernel.wait()
    psutil.Process(zygote_pid).wait(timeout=30)
