"""A workshop room under load: N learners at once on one JupyterHub, for several N.

Run (as root for a system user and a network namespace per learner; make room-test builds
.room/ with the venv and the proxy):

    .room/venv/bin/python benchmarks/room.py --learners 4 6 8 [--notebooks 00,01,02,03,04]

Each N is the scenario of tests/room/test_room.py (tests/room/scenario.py): every learner
signs up, logs in, starts a server and runs the notebooks (``fast``) and a ``%%ranks``
session; two of them also work in headless Chromium; then the cross-talk probes. Timeouts
grow as N / cores. Prints one table row per N (the slowest learner's times, what failed) and
writes the whole summary to benchmarks/results/room-N.json. Stops at the first N that fails
unless ``--keep-going``. Figures are quoted in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.room: the room's harness, shared with the test

from tests.room.scenario import run_room  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def row(summary: dict) -> str:
    """One markdown row: N, isolation, passed, the slowest learner's steps, probes, failures."""
    runs = summary.get("runs", [])
    steps = [r["steps"] for r in runs]

    def worst(prefix: str) -> str:
        values = [v for s in steps for k, v in s.items() if k.startswith(prefix)]
        return f"{max(values):.0f} s" if values else "-"

    course = [sum(v for k, v in s.items() if k.startswith("notebook")) for s in steps]
    failed = "; ".join(f"{r['name']}: {r['error'][:160]}" for r in runs if r["error"])
    probes = summary.get("probes", {})
    cross = "error" if "error" in probes else "none" if probes else "-"
    if probes and "error" not in probes:
        reached = [
            f"{owner}<-{who}: {k}"
            for owner, seen in probes.items()
            for who, got in seen.items()
            if who != "owner"
            for k in ("store", "segment", "signal")
            if got[k] in ("reached", "opened", "allowed")
        ]
        cross = ", ".join(reached) or "none"
    browser = summary.get("browser", {})
    sessions = summary.get("sessions_s", 0)
    return (
        f"| {summary['learners']} | {'user + netns' if summary.get('isolated') else 'shared'} "
        f"| {len(summary.get('passed', []))}/{summary['learners']} | {worst('server start')} "
        f"| {max(course, default=0):.0f} s | {worst('%%ranks')} | {sessions:.0f} s "
        f"| {sum(1 for v in browser.values() if v is True)} | {cross} | {failed or '-'} |"
    )


HEADER = (
    "| learners | isolation | passed | server start (max) | notebooks 00-04 (max) "
    "| %%ranks (max) | all sessions | browsers ok | reached another's | failures |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learners", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--notebooks", default="00,01,02,03,04")
    parser.add_argument("--browsers", type=int, default=2)
    parser.add_argument("--keep-going", action="store_true")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} before the first run")
    print(HEADER)
    for n in args.learners:
        start = time.monotonic()
        summary = run_room(
            n,
            notebooks=args.notebooks.split(","),
            browsers=args.browsers,
            artifacts=RESULTS / f"room-{n}",
        )
        summary["wall_s"] = round(time.monotonic() - start, 1)
        summary["load_after"] = os.getloadavg()[0]
        (RESULTS / f"room-{n}.json").write_text(json.dumps(summary, indent=1))
        print(row(summary), flush=True)
        if len(summary.get("passed", [])) < n and not args.keep_going:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
