"""lk.World and the %%ranks magic: ranks that keep their variables from cell to cell.

.venv/bin/python -m pytest tests/test_ranks.py
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import torch

import labkit as lk
from labkit.ranks import CellError, CellTimeout, WorldStopped

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).resolve().parent / "notebooks" / "ranks_magic.ipynb"


def gone(pids: list[int], within_s: float = 10.0) -> bool:
    """True once none of ``pids`` is a running (non-zombie) process."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def world():
    w = lk.World(world_size=3, timeout=60)
    yield w
    w.close()


def test_state_persists_and_collectives_span_cells(world):
    world.run("x = torch.arange(4, dtype=torch.float32) * (rank + 1)", show=False)
    world.run("dist.all_reduce(x)", show=False)
    world.run("x = x + rank", show=False)  # each rank keeps its own x
    expected = torch.arange(4, dtype=torch.float32) * (1 + 2 + 3)
    for rank, x in enumerate(world.pull("x")):
        torch.testing.assert_close(x, expected + rank, rtol=0, atol=0)


def test_subset_runs_only_there(world):
    world.run("only_here = rank * 10", ranks=[0, 2], show=False)
    assert world.pull("only_here", ranks=[0, 2]) == [0, 20]
    with pytest.raises(CellError) as info:
        world.pull("only_here", ranks=[1])
    assert list(info.value.failures) == [1]
    assert "NameError" in str(info.value)


def test_output_is_grouped_and_labelled_in_rank_order(world, capsys):
    result = world.run("print('a', rank)\nprint('b', rank)\nrank * 2")
    assert capsys.readouterr().out.splitlines() == [
        f"[rank {r}] {line}" for r in range(3) for line in (f"a {r}", f"b {r}", f"{2 * r}")
    ]
    assert [result.outputs[r].value for r in range(3)] == ["0", "2", "4"]


def test_error_names_the_rank_and_the_world_survives(world):
    cell = "before = rank\nif rank == 1:\n    raise ValueError('only rank 1 fails')\nafter = rank"
    with pytest.raises(CellError) as info:
        world.run(cell, show=False)
    err = info.value
    assert list(err.failures) == [1] and err.failures[1].exc_type == "ValueError"
    text = str(err)
    assert "rank 1 raised ValueError: only rank 1 fails" in text
    assert "raise ValueError('only rank 1 fails')" in text  # the cell's own source line
    assert "<rank-cell-" in text and "line 3" in text
    assert err._render_traceback_()[0].startswith("CellError: rank 1")
    assert world.pull("before") == [0, 1, 2]
    assert world.pull("after", ranks=[0, 2]) == [0, 2]
    world.run("dist.barrier()", show=False)  # the group still works on every rank
    assert world.alive


def test_push_sends_values_and_functions(world):
    world.push(scale=3.0, fn=lambda t: t * 2)
    world.run("y = fn(torch.ones(2) * scale * rank)", show=False)
    for rank, y in enumerate(world.pull("y")):
        torch.testing.assert_close(y, torch.full((2,), 6.0 * rank), rtol=0, atol=0)


def test_ctrl_c_interrupts_the_cell_and_keeps_the_world(world, sigint_default):
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            world.run("import time\nfor _ in range(200):\n    time.sleep(0.05)", show=False)
    finally:
        timer.join()
    assert world.alive
    world.run("dist.barrier()", show=False)


def test_subset_collective_times_out_with_stacks_and_stops():
    w = lk.World(world_size=2, timeout=60)
    pids = w.pids
    w.run("x = torch.ones(1)", show=False)
    with pytest.raises(CellTimeout) as info:
        w.run("dist.all_reduce(x)", ranks=[0], timeout=1.5)
    text = str(info.value)
    assert list(info.value.failures) == [0]
    assert "rank(s) 1 did not run it" in text
    assert "dist.all_reduce(x)" in text and "in all_reduce" in text  # rank 0's stack
    assert "world was stopped" in text
    assert not w.alive and gone(pids)
    with pytest.raises(RuntimeError, match="has stopped"):
        w.run("1")


def test_a_dying_rank_stops_the_world():
    w = lk.World(world_size=2, timeout=60)
    pids = w.pids
    with pytest.raises(WorldStopped) as info:
        w.run("import os\nif rank == 1:\n    os._exit(3)", show=False)
    assert list(info.value.failures) == [1] and "exited with code 3" in str(info.value)
    assert not w.alive and gone(pids)


def test_close_leaves_no_process():
    w = lk.World(world_size=2)
    pids = w.pids
    assert all(psutil.pid_exists(p) for p in pids)
    w.close()
    w.close()  # twice is fine
    assert gone(pids, within_s=5)


def test_a_dropped_world_stops_its_ranks():
    dropped = lk.World(world_size=2)
    pids = dropped.pids
    newest = lk.World(world_size=2)  # the magic's world now; the first one is unreferenced
    del dropped
    gc.collect()
    assert gone(pids, within_s=5)
    assert newest.alive
    newest.close()


KEEP_WORLD = """
import sys, time
import labkit as lk
w = lk.World(world_size=2)
print(" ".join(map(str, w.pids)), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_killed_kernel_leaves_no_rank():
    proc = subprocess.Popen(
        [sys.executable, "-c", KEEP_WORLD], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert gone(pids, within_s=10)


def test_magics_in_an_ipython_shell(capsys):
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    try:
        assert ip.run_cell("%load_ext labkit").success
        assert ip.run_cell("n = 2\n%ranks start {n}").success
        pids = lk.ranks.current_world().pids
        assert ip.run_cell("%%ranks\nv = rank + 1").success
        capsys.readouterr()
        assert ip.run_cell("%%ranks 1\nprint('v is', v)").success
        assert capsys.readouterr().out == "[rank 1] v is 2\n"
        assert ip.run_cell("vs = %ranks pull v").success and ip.user_ns["vs"] == [1, 2]
        bad = ip.run_cell("%%ranks\n1 / (rank - 1)")
        assert isinstance(bad.error_in_exec, CellError)
        # IPython shows only the short report (_render_traceback_), not the magic's frames.
        shown = capsys.readouterr().out
        assert "CellError: rank 1 raised ZeroDivisionError" in shown
        assert "[rank 0] -1.0" in shown and "interactiveshell" not in shown
        assert ip.run_cell("%%ranks 0,1 --timeout 30\nv").success  # still usable
        bad = ip.run_cell("%%ranks 0,5\nv")
        assert "ranks in 0..1" in str(bad.error_in_exec)
        assert ip.run_cell("%ranks status").success
        assert str(pids) in capsys.readouterr().out
        assert ip.run_cell("%ranks stop").success
        assert gone(pids, within_s=5)
        bad = ip.run_cell("%%ranks\n1")
        assert "no world is running" in str(bad.error_in_exec)
    finally:
        ip.run_cell("%unload_ext labkit")
        InteractiveShell.clear_instance()


def _stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("name") == "stdout")


@pytest.mark.slow
def test_papermill_runs_the_fixture_notebook(tmp_path):
    import nbformat

    from labkit.course import run_notebook

    result = run_notebook(FIXTURE, tmp_path, {"world_size": 3})
    assert result.ok, (result.error, result.failing_cell)
    nb = nbformat.read(result.output_path, 4)
    cells = {c.source.splitlines()[-1]: c for c in nb.cells if c.cell_type == "code"}
    # The all-gathered ring result, shown rank by rank in rank order.
    gathered = next(c for c in cells.values() if "dist.all_reduce(ref)" in c.source)
    assert _stdout(gathered).splitlines() == [
        f"[rank {r}] tensor([30., 33., 36.])" for r in range(3)
    ]
    subset = next(c for src, c in cells.items() if src.startswith("print(f'rank {rank} sent"))
    assert [line[:8] for line in _stdout(subset).splitlines()] == ["[rank 0]", "[rank 2]"]
    # The world left running at the end went with the kernel papermill shut down.
    last = next(c for src, c in cells.items() if src.startswith("print('left running:'"))
    pids = [int(p) for p in _stdout(last).split("[", 1)[1].rstrip("]\n").split(",")]
    assert len(pids) == 2 and gone(pids, within_s=10)


def test_shutdown_of_the_zygote_stops_the_world():
    # Last in this file: the next launch pays for a fresh zygote.
    w = lk.World(world_size=2)
    lk.shutdown()
    with pytest.raises(WorldStopped, match="stopped with labkit's zygote"):
        w.run("1")
    assert not w.alive
