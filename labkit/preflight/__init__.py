"""Preflight for the course: ``lk.doctor()`` in a notebook, ``labkit doctor`` in a terminal.

Introduced in notebooks/00_setup_and_launcher.ipynb.

Checks Python, torch against the course pin, torch.distributed with gloo (and NCCL), the GPUs
and whether torch can use them (without initialising CUDA in this process), cores, memory,
``/dev/shm``, loopback networking, leftover labkit processes, the notebook tooling and a C++
compiler. Each check says what it measured and, when it is not ok, what to do.
"fail" means something blocks the course.

Run it from a terminal (exit status 1 when a check fails):

    labkit doctor                 # or: python -m labkit.preflight
    labkit doctor --json          # machine-readable
    labkit doctor --kill-stale    # also stop labkit processes left from earlier runs

Under ``torchrun`` (``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` set) every rank joins a gloo
group and the report gains the cross-rank checks of :mod:`labkit.preflight.cluster`: the same
torch, CUDA, NCCL, Python and labkit on every rank, and with ``--shared-dir`` a directory that
every rank sees. One rank per node (``LOCAL_RANK`` 0) checks its machine; each prints its report:

    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m labkit.preflight --shared-dir /shared/ckpt
"""

from __future__ import annotations

import argparse
import html
import json
import os
import socket
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from labkit.preflight.checks import Check
from labkit.preflight.gpu import GpuQuery

__all__ = ["Check", "DoctorReport", "doctor", "main"]

_STATUS_LABEL = {"ok": "ok", "warn": "WARN", "fail": "FAIL"}
_STATUS_COLOUR = {"ok": "#d4edda", "warn": "#fff3cd", "fail": "#f8d7da"}
_WIDTH = 100  # wrap the text table to this many columns


@dataclass(repr=False)
class DoctorReport:
    """The doctor's checks: a text table when printed, an HTML table in Jupyter.

    Attributes:
        checks: one :class:`Check` per line, in the order they ran.
        verbose: show how long each check took.
    """

    checks: list[Check]
    verbose: bool = False

    @property
    def ok(self) -> bool:
        """True when no check failed (warnings allowed)."""
        return all(check.status != "fail" for check in self.checks)

    def counts(self) -> dict[str, int]:
        """How many checks ended ok, warn and fail."""
        return {s: sum(c.status == s for c in self.checks) for s in _STATUS_LABEL}

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check named {name!r}; have {[c.name for c in self.checks]}")

    def to_dict(self) -> dict:
        """JSON-ready: ``{"ok": bool, "counts": {...}, "checks": [{name, status, ...}]}``."""
        return {
            "ok": self.ok,
            "counts": self.counts(),
            "checks": [asdict(check) for check in self.checks],
        }

    def _summary(self) -> str:
        counts = self.counts()
        verdict = "ready" if self.ok else "not ready: fix the FAIL lines"
        return (
            f"labkit doctor: {counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail"
            f" — {verdict}"
        )

    def __str__(self) -> str:
        name_w = max((len(c.name) for c in self.checks), default=0)
        rows = [self._summary()]
        for check in self.checks:
            head = f"{_STATUS_LABEL[check.status]:<4}  {check.name:<{name_w}}  "
            if self.verbose:
                head += f"{check.seconds * 1000:6.0f} ms  "
            indent = " " * len(head)
            lines = [_wrap(line, indent, indent + "  ") for line in check.detail.splitlines()]
            if check.status != "ok" and check.fix:
                lines.append(_wrap(f"fix: {check.fix}", indent, indent + "     "))
            rows.append(head + (lines[0][len(indent) :] if lines else ""))
            rows.extend(lines[1:])
        return "\n".join(rows)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        def cell(text: str) -> str:
            return html.escape(text).replace("\n", "<br>")

        head = "<th>status</th><th>check</th>"
        head += "<th>time</th>" if self.verbose else ""
        head += "<th>detail</th><th>fix</th>"
        rows = []
        for c in self.checks:
            style = f"background:{_STATUS_COLOUR[c.status]};font-weight:bold"
            row = f'<td style="{style}">{_STATUS_LABEL[c.status]}</td><td>{cell(c.name)}</td>'
            if self.verbose:
                row += f"<td>{c.seconds * 1000:.0f} ms</td>"
            fix = cell(c.fix) if c.status != "ok" else ""
            row += f'<td style="text-align:left">{cell(c.detail)}</td>'
            row += f'<td style="text-align:left">{fix}</td>'
            rows.append(f"<tr>{row}</tr>")
        return (
            f"<p><b>{cell(self._summary())}</b></p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"
        )


def _wrap(text: str, indent: str, subsequent: str) -> str:
    return textwrap.fill(
        text,
        width=max(_WIDTH, len(subsequent) + 40),
        initial_indent=indent,
        subsequent_indent=subsequent,
        break_on_hyphens=False,
        break_long_words=False,
    )


def _timed(name: str, fn: Callable[..., Check], *args: object) -> Check:
    start = time.perf_counter()
    try:
        check = fn(*args)
    except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
        check = _broken(name, exc)
    check.seconds += time.perf_counter() - start
    return check


def _broken(name: str, exc: Exception) -> Check:
    return Check(
        name,
        "warn",
        f"the check itself raised {type(exc).__name__}: {exc}",
        "this is a labkit bug: please report it with this output",
    )


def doctor(verbose: bool = False, kill_stale: bool = False) -> DoctorReport:
    """Check this machine for the course and return the report (printing nothing).

    Takes well under 3 s once torch is imported, plus, where GPUs are listed and torch is a
    CUDA build, one ``python -c`` subprocess that imports torch and asks CUDA; starts no
    ranks, never initialises CUDA in this process. In a notebook, leave the report as the
    cell's last expression to see it.

    Args:
        verbose: show how long each check took.
        kill_stale: terminate labkit processes left from earlier runs (see
            :mod:`labkit.preflight.stale`); this process's own worker is never touched.

    Returns:
        A :class:`DoctorReport`; ``report.ok`` is False when something blocks the course.
    """
    from labkit.preflight import checks as env
    from labkit.preflight import gpu as gpu
    from labkit.preflight import host as host
    from labkit.preflight import room as room
    from labkit.preflight import stale as stale
    from labkit.preflight import torch_cuda as torch_cuda

    checks = [
        _timed("python", env.check_python),
        _timed("torch", env.check_torch),
        _timed("torch.distributed", env.check_distributed),
        _timed("gloo", env.check_gloo),
    ]
    start = time.perf_counter()
    try:
        query = gpu.query_gpus()
    except Exception as exc:  # noqa: BLE001 - reported as the gpus check's warning
        query = GpuQuery((), "none", f"the GPU query raised {type(exc).__name__}: {exc}")
    query_s = time.perf_counter() - start
    n_gpus = len(query.gpus)
    gpus_check = _timed("gpus", gpu.check_gpus, query)
    gpus_check.seconds += query_s
    # torch may not use the GPUs listed (CPU build, old driver, no kernels for the GPU):
    # the world-size advice counts only those NCCL can use.
    start = time.perf_counter()
    try:
        verdict = torch_cuda.assess_torch_cuda(query)
    except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
        verdict = torch_cuda.Verdict(_broken("torch cuda", exc), 0)
    verdict.check.seconds = time.perf_counter() - start
    checks += [
        _timed("nccl", gpu.check_nccl, n_gpus),
        gpus_check,
        verdict.check,
    ]
    try:  # only in a workshop room: what its hub gave this learner (docker/room/)
        seat = room.check_room_seat(verdict.usable_gpus)
    except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
        seat = _broken("room seat", exc)
    if seat is not None:
        checks.append(seat)
    checks += [
        _timed("cuda state", gpu.check_cuda_state),
        _timed("cpu", host.check_cpu, verdict.usable_gpus),
        _timed("memory", host.check_memory),
        _timed("/dev/shm", host.check_shm, n_gpus),
        _timed("loopback", host.check_loopback),
        _timed("tcp port", host.check_tcp_port),
        _timed("stale processes", stale.check_stale, kill_stale),
        _timed("jupyter", host.check_jupyter),
        _timed("c++ compiler", host.check_compiler),
    ]
    return DoctorReport(checks, verbose=verbose)


def main(argv: list[str] | None = None) -> int:
    """``labkit doctor``: print the report (a table, or JSON with ``--json``).

    Args:
        argv: command-line arguments after ``doctor`` (``sys.argv[1:]`` when None).

    Returns:
        The exit status: 1 when any check fails, else 0.
    """
    parser = argparse.ArgumentParser(
        prog="labkit doctor",
        description="Check this machine for the distributed-training course.",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--kill-stale",
        action="store_true",
        help="terminate labkit zygotes and ranks left over from earlier runs",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show each check's time")
    parser.add_argument(
        "--shared-dir",
        metavar="PATH",
        help="under torchrun: check that every rank sees this directory (for checkpoints)",
    )
    args = parser.parse_args(argv)
    if all(os.environ.get(k) for k in TORCHRUN_ENV):
        report = _doctor_job(args)
    else:
        if args.shared_dir:
            parser.error("--shared-dir needs several ranks: run the doctor under torchrun")
        report = doctor(verbose=args.verbose, kill_stale=args.kill_stale)
    if report is not None:
        print(json.dumps(report.to_dict(), indent=2) if args.json else report, flush=True)
    return 0 if report is None or report.ok else 1


TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK")  # torchrun sets these in every worker
JOB_TIMEOUT_S = 120  # how long a rank waits for the others in the cross-rank checks


def _doctor_job(args: argparse.Namespace) -> DoctorReport | None:
    """Under torchrun: this node's checks (on LOCAL_RANK 0) plus the cross-rank ones.

    Returns:
        The report to print: on LOCAL_RANK 0 this machine's checks and the cross-rank ones;
        None on the other ranks of a node whose cross-rank checks passed.
    """
    from datetime import timedelta

    import torch.distributed as dist

    from labkit.preflight.cluster import job_checks

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    # kill_stale only on request and only from one rank per machine: it must not race itself.
    machine = doctor(verbose=args.verbose, kill_stale=args.kill_stale) if local_rank == 0 else None
    dist.init_process_group("gloo", timeout=timedelta(seconds=JOB_TIMEOUT_S))
    try:
        across = job_checks(shared_dir=args.shared_dir)
        dist.barrier()  # nobody tears the group down while another rank still gathers
    finally:
        dist.destroy_process_group()
    host = socket.gethostname() or "unknown host"
    title = Check("job", "ok", f"rank {rank} of {os.environ['WORLD_SIZE']} on {host}")
    checks = [title, *across, *(machine.checks if machine is not None else [])]
    report = DoctorReport(checks, verbose=args.verbose)
    return report if machine is not None or not report.ok else None


if __name__ == "__main__":
    raise SystemExit(main())
