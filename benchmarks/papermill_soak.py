"""Soak test: run notebooks headlessly N times, under CPU load, and catch runs that stall.

    .venv/bin/python benchmarks/papermill_soak.py notebooks/18_hybrid_parallel.ipynb --load 2
    .venv/bin/python benchmarks/papermill_soak.py --minimal launch-widget --client upstream
    .venv/bin/python benchmarks/papermill_soak.py --course --runs 10 --out soak-course

``--course`` soaks the whole fast course: each of the ``--runs`` passes runs every notebook in
notebooks/ in order, as ``labkit course run --fast`` does, each notebook watched on its own;
then any failed notebook, not only a hang or a stall, makes the exit status 1.

Each run executes the notebook through ``labkit.course.run_notebook`` (``fast=True``) in a child
process, watched by a per-run watchdog. ``--load K`` keeps K busy-looping processes on the
cores for the whole soak (other jobs on the machine add to that). ``--client`` picks the
Jupyter client the runner drives the kernel with:

  labkit    labkit.course.kernel.WatchedKernelManager (what run_notebook uses: the fix)
  rearm     the same client with its idle watch off: the re-arm after a shell send alone
  upstream  jupyter_client's AsyncKernelManager (nbclient's default: the client before the fix)

Every run records each message the client sends and receives (``trace-NN.jsonl``: local time,
direction, channel, type, ids and the sender's header date). A shell reply that reached the
client long after the kernel sent it is a *stall*: ``stall_s`` is the largest gap between a
reply's header date (the kernel's clock; same machine) and the moment the client got it. A run
still going after ``--watchdog`` seconds is a *hang*: the script then saves py-spy dumps of the
client and of the kernel (``--py-spy PATH``, default ``py-spy`` on PATH; absent, it notes it),
the client's trace so far, and kills the run. ``--minimal`` runs a generated notebook instead:

  launch-widget  a 4-rank lk.launch cell, then lk.widgets.planner_explorer (notebook 14's pair)
  launch         the launch cell only
  widget         the widget cell only

The summary (``summary.json`` in ``--out`` and the last line printed) counts ok, failed, stalled
and hung runs. See benchmarks/RESULTS.md ("Headless runs that stalled at a widget cell").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STALL_S = 5.0  # a reply this late is a stall, not scheduling noise

_LAUNCH_CELL = """\
def work(rank, world_size):
    t = torch.ones(1 << 16) * rank
    for _ in range(20):
        dist.all_reduce(t)
    return float(t[0])

out = lk.launch(work, world_size, backend="gloo")
print(out)
"""
_WIDGET_CELL = """\
gpt = lk.planner.ModelSpec(n_params=7 * 10**9, n_layers=32, hidden=4096, seq_len=2048,
                           batch=64, n_heads=32, name="GPT-7B")
gpus = lk.planner.DeviceSpec(count=8, memory_bytes=80e9, flops=400e12)
lk.widgets.planner_explorer(gpt, gpus, "NVLink")
"""


def minimal_notebook(kind: str, folder: Path) -> Path:
    """Write the ``--minimal`` notebook ``kind`` into ``folder`` and return its path."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    cells = [
        new_code_cell("import torch\nimport torch.distributed as dist\n\nimport labkit as lk"),
        new_code_cell("world_size: int = 4\nfast: bool = False", metadata={"tags": ["parameters"]}),
    ]
    if kind in ("launch-widget", "launch"):
        cells.append(new_code_cell(_LAUNCH_CELL))
    if kind in ("launch-widget", "widget"):
        cells.append(new_code_cell(_WIDGET_CELL))
    cells.append(new_code_cell("print('done')"))
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.metadata["language_info"] = {"name": "python"}
    path = folder / f"soak_{kind.replace('-', '_')}.ipynb"
    nbformat.write(nb, path)
    return path


# -- the child: one run, traced --------------------------------------------------------------


def _traced_manager(client: str, trace_path: Path) -> type:
    """A kernel manager class for ``client`` whose clients log every shell/IOPub message."""
    from jupyter_client.asynchronous.client import AsyncKernelClient
    from jupyter_client.channels import AsyncZMQSocketChannel
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Type, default

    from labkit.course.kernel import (
        WatchedIOPubChannel,
        WatchedKernelClient,
        WatchedKernelManager,
        WatchedShellChannel,
    )

    trace = open(trace_path, "a", buffering=1)  # noqa: SIM115 - lives as long as the child

    def log(direction: str, channel: str, msg: dict) -> None:
        header = msg.get("header", {})
        date = header.get("date")
        row = {
            "t": time.time(),
            "dir": direction,
            "ch": channel,
            "type": header.get("msg_type"),
            "id": header.get("msg_id"),
            "parent": msg.get("parent_header", {}).get("msg_id"),
            "date": date.timestamp() if hasattr(date, "timestamp") else None,
        }
        if header.get("msg_type") == "status":
            row["state"] = msg["content"].get("execution_state")
        trace.write(json.dumps(row) + "\n")

    def traced(base: type, channel: str) -> type:
        class Traced(base):
            def send(self, msg):
                log("send", channel, msg)
                super().send(msg)

            async def get_msg(self, timeout=None):
                msg = await super().get_msg(timeout)
                log("recv", channel, msg)
                return msg

        Traced.__name__ = f"Traced{base.__name__}"
        return Traced

    if client == "upstream":
        shell, iopub, client_base, manager_base = (
            AsyncZMQSocketChannel, AsyncZMQSocketChannel, AsyncKernelClient, AsyncKernelManager
        )  # fmt: skip
    else:
        shell, iopub, client_base, manager_base = (
            WatchedShellChannel, WatchedIOPubChannel, WatchedKernelClient, WatchedKernelManager
        )  # fmt: skip

    class TracedClient(client_base):
        shell_channel_class = Type(traced(shell, "shell"))
        iopub_channel_class = Type(traced(iopub, "iopub"))

    class TracedManager(manager_base):
        @default("client_factory")
        def _traced_client_factory(self) -> type:
            return TracedClient

    return TracedManager


def child(args: argparse.Namespace) -> int:
    from labkit.course import run_notebook

    manager = _traced_manager(args.client, Path(args.trace))
    kwargs = {}
    if args.client == "rearm":
        kwargs["idle_timeout"] = 0
    result = run_notebook(
        args.notebook, args.child_out, {"fast": True}, cell_timeout=args.cell_timeout,
        kernel_manager_class=manager, **kwargs,
    )  # fmt: skip
    err = result.error
    first = (err.evalue.splitlines() or [""])[0] if err else ""
    print(json.dumps({
        "status": result.status,
        "seconds": result.seconds,
        "error": f"{err.ename}: {first}" if err else None,
        "cell": err.cell_index if err else None,
    }))  # fmt: skip
    return 0


# -- the parent: the soak ----------------------------------------------------------------------


def start_load(k: int) -> list[subprocess.Popen]:
    code = "while True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(k)]


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _is_kernel(proc) -> bool:
    try:
        return any("ipykernel" in arg for arg in proc.cmdline()[:3])
    except Exception:  # noqa: BLE001 - it exited meanwhile
        return False


def py_spy_dump(py_spy: str | None, pid: int, dest: Path) -> None:
    if py_spy is None:
        dest.write_text("py-spy not found: pass --py-spy PATH\n")
        return
    proc = subprocess.run(
        [py_spy, "dump", "--pid", str(pid), "--locals"], capture_output=True, text=True, timeout=60
    )
    dest.write_text(proc.stdout + proc.stderr)


def stalls(trace_path: Path) -> tuple[float, list[dict]]:
    """The largest reply delay in a trace, and the shell replies that came STALL_S or later."""
    worst, late = 0.0, []
    if not trace_path.exists():
        return worst, late
    for line in trace_path.read_text().splitlines():
        row = json.loads(line)
        if row["dir"] == "recv" and row["ch"] == "shell" and row["date"] is not None:
            delay = row["t"] - row["date"]
            worst = max(worst, delay)
            if delay >= STALL_S:
                late.append({**row, "delay_s": round(delay, 3)})
    return worst, late


def run_once(
    args: argparse.Namespace, notebook: Path, out: Path, tag: str, py_spy: str | None
) -> dict:
    """One watched run of ``notebook`` in a child process; its row for the summary."""
    trace = out / f"trace-{tag}.jsonl"
    trace.unlink(missing_ok=True)
    log = open(out / f"run-{tag}.log", "w")  # noqa: SIM115
    cmd = [
        sys.executable, __file__, "--child", "--notebook", str(notebook),
        "--client", args.client, "--trace", str(trace),
        "--child-out", tempfile.mkdtemp(prefix=f"soak-{tag}-", dir=out),
        "--cell-timeout", str(args.cell_timeout),
    ]  # fmt: skip
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    _running[0] = proc
    try:
        stdout, _ = proc.communicate(timeout=args.watchdog)
        hung = False
    except subprocess.TimeoutExpired:
        hung = True
        kernels = [p for p in _descendants(proc.pid) if _is_kernel(p)]
        py_spy_dump(py_spy, proc.pid, out / f"hang-{tag}-client.txt")
        for k in kernels:
            py_spy_dump(py_spy, k.pid, out / f"hang-{tag}-kernel-{k.pid}.txt")
        for p in reversed(_descendants(proc.pid)):
            p.kill()
        proc.kill()
        stdout, _ = proc.communicate()
    log.close()
    seconds = time.monotonic() - start
    lines = [ln for ln in (stdout or "").splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"status": "no result"}
    worst, late = stalls(trace)
    return {
        "notebook": notebook.name, "hung": hung, "wall_s": round(seconds, 1),
        "status": "hung" if hung else result.get("status"),
        "error": result.get("error"), "cell": result.get("cell"),
        "stall_s": round(worst, 3), "late_replies": late,
    }  # fmt: skip


_running: list[subprocess.Popen | None] = [None]


def soak(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.minimal:
        notebooks = [minimal_notebook(args.minimal, out)]
    elif args.course:
        notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    else:
        notebooks = [Path(nb).resolve() for nb in args.notebook]
    py_spy = args.py_spy or shutil.which("py-spy")
    load = start_load(args.load)
    runs = []
    names = notebooks[0].name if len(notebooks) == 1 else f"{len(notebooks)} notebooks"
    print(f"soak: {names} x{args.runs}, client={args.client}, load={args.load}, "
          f"watchdog={args.watchdog:g} s, cell timeout={args.cell_timeout:g} s")  # fmt: skip
    interrupted = False
    try:
        for i in range(args.runs):
            for nb in notebooks:
                tag = f"{i:02d}" if len(notebooks) == 1 else f"{i:02d}-{nb.stem}"
                row = {"run": i, **run_once(args, nb, out, tag, py_spy)}
                runs.append(row)
                flag = "HANG" if row["hung"] else ("STALL" if row["late_replies"] else "")
                print(f"run {i:2d} {nb.stem}: {row['status']:<9} {row['wall_s']:6.1f} s  "
                      f"worst reply delay {row['stall_s']:7.3f} s {flag} "
                      f"{row['error'] or ''}", flush=True)  # fmt: skip
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C or kill: keep the runs done so far
        interrupted = True
        proc = _running[0]
        if proc is not None and proc.poll() is None:
            for p in reversed(_descendants(proc.pid)):
                p.kill()
            proc.kill()
    finally:
        for p in load:
            p.kill()
            p.wait()
    summary = {
        "notebooks": [nb.name for nb in notebooks], "client": args.client, "load": args.load,
        "interrupted": interrupted,
        "watchdog_s": args.watchdog, "cell_timeout_s": args.cell_timeout,
        "passes": args.runs, "runs": len(runs),
        "ok": sum(r["status"] == "ok" for r in runs),
        "failed": sum(r["status"] not in ("ok", "hung") for r in runs),
        "stalled": sum(bool(r["late_replies"]) for r in runs),
        "hung": sum(r["hung"] for r in runs),
        "per_run": runs,
    }  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: v for k, v in summary.items() if k not in ("per_run", "notebooks")}))
    bad = summary["hung"] or summary["stalled"] or (args.course and summary["failed"])
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", nargs="*", help="the notebooks to run, in this order")
    parser.add_argument("--course", action="store_true", help="every notebook in notebooks/")
    parser.add_argument("--minimal", choices=["launch-widget", "launch", "widget"])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--load", type=int, default=0, help="busy-looping processes")
    parser.add_argument("--client", choices=["labkit", "rearm", "upstream"], default="labkit")
    parser.add_argument("--watchdog", type=float, default=300.0, help="seconds per run")
    parser.add_argument("--cell-timeout", type=float, default=600.0)
    parser.add_argument("--out", default="soak-output")
    parser.add_argument("--py-spy", help="py-spy executable (default: py-spy on PATH)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--notebook", dest="notebook_opt", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.notebook = args.notebook_opt
        return child(args)
    if bool(args.notebook) + bool(args.minimal) + args.course != 1:
        parser.error("give notebooks, --course or --minimal KIND (one of them)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return soak(args)


if __name__ == "__main__":
    sys.exit(main())
