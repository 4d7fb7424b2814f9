"""Every way a launch can fail stops the whole world quickly and leaves no rank behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import labkit as lk
from labkit.launcher import current_zygote_pid
from tests.launch_helpers import ROOT, owned_processes, ranks_of, wait_until

QUICK_S = 10.0  # "within a few seconds", with room for a loaded 2-core CI machine


@pytest.fixture(autouse=True)
def no_rank_survives():
    """After every test here: no rank of ours is alive and the warm pool is one process."""
    yield
    assert ranks_of() == [], "a rank outlived its launch"
    mine = owned_processes()
    assert len(mine) <= 1, f"the warm pool grew: {[p.cmdline() for p in mine]}"
    # The next launch works.
    assert lk.launch(lambda r, w: r, world_size=2, timeout=60) == [0, 1]


def _sleep_unless(rank, world_size, bad_rank, action):
    import os
    import signal
    import time

    if rank == bad_rank:
        time.sleep(0.3)
        if action == "raise":
            raise ValueError(f"bad value on rank {rank}")
        if action == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if action == "exit":
            os._exit(3)
        if action == "segfault":
            import ctypes

            ctypes.string_at(0)
    time.sleep(120)


def test_raising_rank_stops_the_world_with_its_traceback():
    t0 = time.monotonic()
    with pytest.raises(lk.RankError) as info:
        lk.launch(_sleep_unless, world_size=4, args=(2, "raise"))
    assert time.monotonic() - t0 < QUICK_S
    err = info.value
    assert err.ranks == [2] and err.stopped == [0, 1, 3]
    msg = str(err)
    assert "rank 2 raised ValueError: bad value on rank 2" in msg
    assert 'raise ValueError(f"bad value on rank {rank}")' in msg  # the remote source line
    assert "labkit/launcher" not in msg  # launcher internals are not the learner's business
    assert err.failures[2].exc_type == "ValueError"


def test_notebook_style_function_shows_its_source_line():
    ns: dict = {}
    src = "def cell_fn(rank, world_size):\n    if rank == 1:\n        1 / 0\n"
    import linecache

    fname = "/tmp/ipykernel_0/cell_demo.py"  # how IPython names a cell's code
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    exec(compile(src, fname, "exec"), ns)
    with pytest.raises(lk.RankError) as info:
        lk.launch(ns["cell_fn"], world_size=2)
    assert f'File "{fname}", line 3, in cell_fn' in str(info.value)
    assert "1 / 0" in str(info.value)


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("sigkill", "was killed by SIGKILL (9)"),
        ("exit", "exited with code 3"),
        ("segfault", "was killed by SIGSEGV (11)"),
    ],
)
def test_rank_dying_without_raising_is_reported(action, expected):
    t0 = time.monotonic()
    with pytest.raises(lk.RankError) as info:
        lk.launch(_sleep_unless, world_size=3, args=(1, action))
    assert time.monotonic() - t0 < QUICK_S
    assert info.value.ranks == [1]
    assert f"rank 1 {expected}" in str(info.value)
    if action == "segfault":
        assert "Segmentation fault" in str(info.value)  # faulthandler's report, from stderr


def test_hang_past_timeout_shows_where_each_rank_was():
    def deadlock(rank, world_size):
        import time

        import torch
        import torch.distributed as dist

        if rank == 1:
            time.sleep(120)  # rank 1 never joins the all_reduce
        dist.all_reduce(torch.ones(2))

    t0 = time.monotonic()
    with pytest.raises(lk.LaunchTimeout) as info:
        lk.launch(deadlock, world_size=3, timeout=3)
    assert time.monotonic() - t0 < 3 + QUICK_S
    err = info.value
    assert isinstance(err, TimeoutError) and isinstance(err, lk.RankError)
    assert sorted(err.failures) == [0, 1, 2]
    stacks = {r: f.stack for r, f in err.failures.items()}
    assert "time.sleep(120)" in stacks[1] and "in all_reduce" not in stacks[1]
    for r in (0, 2):
        assert "dist.all_reduce(torch.ones(2))" in stacks[r]
        assert "in all_reduce" in stacks[r]
    assert "deadlock" in str(err)


def test_interrupt_stops_every_rank_and_the_next_launch_works(sigint_default):
    def slow(rank, world_size):
        import time

        time.sleep(120)

    timer = threading.Timer(2.0, lambda: os.kill(os.getpid(), signal.SIGINT))
    t0 = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        lk.launch(slow, world_size=3)
    timer.cancel()
    assert time.monotonic() - t0 < 2.0 + QUICK_S


def test_pool_does_not_grow_across_failures_and_shutdown_ends_it():
    lk.launch(lambda r, w: None, world_size=2)
    zygote = current_zygote_pid()
    for action in ("raise", "exit"):
        with pytest.raises(lk.RankError):
            lk.launch(_sleep_unless, world_size=2, args=(0, action))
        assert current_zygote_pid() == zygote  # the same warm process, no new ones
        assert [p.pid for p in owned_processes()] == [zygote]
    lk.shutdown()
    assert wait_until(lambda: owned_processes() == [], 10)


def test_a_dead_zygote_is_replaced():
    lk.launch(lambda r, w: None, world_size=2)
    old = current_zygote_pid()
    os.kill(old, signal.SIGKILL)
    assert wait_until(lambda: current_zygote_pid() != old, 5)
    assert lk.launch(lambda r, w: r, world_size=2) == [0, 1]
    assert current_zygote_pid() not in (None, old)


def _script(code: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_default_in_child,
    )


def _sigint_default_in_child() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Python then installs KeyboardInterrupt


def test_ctrl_c_in_a_script_stops_ranks_and_keeps_the_process_usable():
    proc = _script("""
        import labkit as lk, sys
        def slow(rank, ws):
            import time
            print("running", flush=True)
            time.sleep(120)
        try:
            lk.launch(slow, world_size=3)
        except KeyboardInterrupt:
            print("INTERRUPTED", flush=True)
        print(lk.launch(lambda r, w: r, world_size=2), flush=True)
    """)
    line = ""
    while "running" not in line:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "INTERRUPTED" in out and "[0, 1]" in out
    assert wait_until(lambda: owned_processes(proc.pid) == [], 10)


def test_killing_the_kernel_takes_zygote_and_ranks_with_it():
    proc = _script("""
        import labkit as lk
        def slow(rank, ws):
            import time
            print("running", flush=True)
            time.sleep(120)
        lk.launch(slow, world_size=2)
    """)
    line = ""
    while "running" not in line:
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
    assert len(owned_processes(proc.pid)) == 3  # zygote + 2 ranks
    proc.kill()  # like a kernel that dies: no Python cleanup runs at all
    proc.wait()
    assert wait_until(lambda: owned_processes(proc.pid) == [], 10), "orphans survived"


def test_headline_names_the_rank_that_failed_first_not_the_lowest():
    def staggered(rank, world_size):
        import time

        if rank == 2:
            raise ValueError("the root cause")
        time.sleep(0.2)  # peers fail later, as they do when a dead rank breaks their collective
        raise RuntimeError("Connection closed by peer (a consequence)")

    with pytest.raises(lk.RankError) as info:
        lk.launch(staggered, world_size=3)
    err = info.value
    assert err.ranks == [0, 1, 2]
    assert err.first.rank == 2
    assert str(err).startswith("ranks 0, 1, 2 failed; the first to fail was rank 2, which raised")
