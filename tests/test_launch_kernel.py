"""lk.launch inside a real Jupyter kernel (the one JupyterLab and papermill talk to)."""

from __future__ import annotations

import queue
import textwrap
import time

import pytest
from jupyter_client.manager import start_new_kernel

from tests.launch_helpers import ROOT, owned_processes, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def kernel():
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    try:
        yield km, kc
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run_cell(kc, code: str, timeout: float = 120.0, interrupt_after=None, km=None):
    """Execute ``code``; return (status, stdout text, stderr text, error name, stream times)."""
    msg_id = kc.execute(textwrap.dedent(code))
    out, err, ename, times = [], [], None, []
    start = time.monotonic()
    interrupted = False
    while True:
        late = interrupt_after is not None and time.monotonic() - start > interrupt_after
        if late and not interrupted:
            km.interrupt_kernel()
            interrupted = True
        try:
            msg = kc.get_iopub_msg(timeout=0.2)
        except queue.Empty:
            if time.monotonic() - start > timeout:
                raise TimeoutError(code) from None
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        kind, content = msg["msg_type"], msg["content"]
        if kind == "stream":
            (out if content["name"] == "stdout" else err).append(content["text"])
            times.append(time.monotonic())
        elif kind == "error":
            ename = content["ename"]
        elif kind == "status" and content["execution_state"] == "idle":
            break
    while True:  # the reply to this request (under load, others can come first)
        reply = kc.get_shell_msg(timeout=30)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    return reply["content"]["status"], "".join(out), "".join(err), ename, times


def test_cell_defined_function_runs_on_four_ranks_with_prefixed_output(kernel):
    km, kc = kernel
    status, out, err, ename, _ = run_cell(
        kc,
        """
        import labkit as lk
        import torch, torch.distributed as dist
        scale = 3
        def f(rank, world_size):
            t = torch.tensor([rank * scale])
            dist.all_reduce(t)
            print(f"rank {rank} sees {t.item()}")
            return t.item()
        result = lk.launch(f, world_size=4)
        print("RESULT", result)
    """,
    )
    assert status == "ok", (ename, err)
    for r in range(4):
        assert f"[rank {r}] rank {r} sees 18" in out
    assert "RESULT [18, 18, 18, 18]" in out
    assert "hostname of the client socket" not in err and "[Gloo]" not in err


def test_rank_error_shows_the_cell_source_line(kernel):
    km, kc = kernel
    status, out, err, ename, _ = run_cell(
        kc,
        """
        import labkit as lk
        def g(rank, world_size):
            if rank == 2:
                raise KeyError("missing-key-in-cell")
        try:
            lk.launch(g, world_size=3)
        except lk.RankError as e:
            print(e)
    """,
    )
    assert status == "ok"
    assert "rank 2 raised KeyError" in out
    assert 'raise KeyError("missing-key-in-cell")' in out  # source of a notebook cell


def test_interrupt_button_stops_ranks_and_kernel_stays_usable(kernel):
    km, kc = kernel
    status, out, err, ename, _ = run_cell(
        kc,
        """
        import os
        import labkit as lk
        def slow(rank, world_size):
            import time
            print("started", flush=True)
            time.sleep(300)
        lk.launch(slow, world_size=3)
    """,
        interrupt_after=4.0,
        km=km,
    )
    assert status == "error" and ename == "KeyboardInterrupt", (status, out, err)
    _, pid_out, _, _, _ = run_cell(kc, "print(os.getpid())")
    kernel_pid = int(pid_out.strip())
    assert wait_until(
        lambda: [p for p in owned_processes(kernel_pid) if "rank" in " ".join(p.cmdline())] == [],
        10,
    )
    status, out, _, _, _ = run_cell(kc, "print(lk.launch(lambda r, w: r, world_size=2))")
    assert status == "ok" and "[0, 1]" in out


def test_shutdown_leaves_no_process(kernel):
    km, kc = kernel
    _, pid_out, _, _, _ = run_cell(kc, "import os; print(os.getpid())")
    kernel_pid = int(pid_out.strip())
    run_cell(kc, "lk.launch(lambda r, w: r, world_size=2)")
    assert len(owned_processes(kernel_pid)) == 1  # the warm worker
    status, _, _, _, _ = run_cell(kc, "lk.shutdown()")
    assert status == "ok"
    assert wait_until(lambda: owned_processes(kernel_pid) == [], 10)


def test_kernel_shutdown_takes_the_warm_worker_with_it():
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    try:
        _, pid_out, _, _, _ = run_cell(kc, "import os, labkit as lk; print(os.getpid())")
        kernel_pid = int(pid_out.strip())
        status, *_ = run_cell(kc, "lk.launch(lambda r, w: r, world_size=2)")
        assert status == "ok" and len(owned_processes(kernel_pid)) == 1
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)  # how JupyterLab's "shut down kernel" ends it
    assert wait_until(lambda: owned_processes(kernel_pid) == [], 10)
