"""The room scenario, shared by tests/room/test_room.py and benchmarks/room.py.

N learners at once on one hub: each signs up, logs in, starts a server and runs notebooks
00-04 and a ``%%ranks`` session in it, while two of them also log in with a real browser and
run a launch cell there; then the cross-talk probes (learner 1's world and segment against
every other learner, learner 2's against learner 1). Timeouts grow with the load: every wait
is multiplied by ``scale = max(1, (N + load average) / cores)``, the
learners' labkit deadlines too (``LABKIT_TIMEOUT_SCALE``, ``lk.stretch``).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict
from pathlib import Path

from tests.room import browser as room_browser
from tests.room.client import Learner
from tests.room.hub import running_room
from tests.room.learner import CELL_TIMEOUT_S, COURSE, LearnerRun, probe, session


def load_scale(n: int) -> float:
    """How much every timeout grows: ``n`` learners plus the load already on this machine
    (its 1-minute load average: other jobs share these cores), over the cores."""
    return max(1.0, (n + os.getloadavg()[0]) / (os.cpu_count() or 1))


def run_room(
    n: int,
    notebooks: list[str] | None = None,
    browsers: int = 2,
    artifacts: Path | None = None,
    isolated: bool | None = None,
) -> dict:
    """Run the scenario; a JSON-able summary (it raises nothing a learner did)."""
    notebooks = COURSE if notebooks is None else notebooks
    scale = load_scale(n)
    artifacts = artifacts or Path("test-artifacts")
    why_no_browser = room_browser.available() if browsers else "not asked"
    summary: dict = {"learners": n, "scale": scale, "notebooks": notebooks}
    start = time.monotonic()
    with running_room(n, isolated=isolated, scale=scale, keep=artifacts) as room:
        summary["isolated"] = room.isolated
        summary["hub_up_s"] = round(time.monotonic() - start, 1)
        learners = [Learner(room.url, name, room.passwords[name]) for name in room.names]
        runs = [LearnerRun(x.name) for x in learners]
        ready = [threading.Event() for _ in learners]
        threads = [
            threading.Thread(
                target=session, args=(x, scale, notebooks, ready[i], runs[i]), daemon=True
            )
            for i, x in enumerate(learners)
        ]
        t0 = time.monotonic()
        for t in threads:
            t.start()
        shown = learners[: min(browsers, n)] if why_no_browser is None else []
        for i in range(len(shown)):
            ready[i].wait(600 * scale)
        try:
            texts = room_browser.browse_all(room.url, shown, artifacts, 120 * scale)
            summary["browser"] = {name: "launch returned [0, 1]" in t for name, t in texts.items()}
        except Exception as exc:  # noqa: BLE001 - reported with the rest
            summary["browser"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        if why_no_browser:
            summary["browser"] = {"skipped": why_no_browser}
        for t in threads:
            t.join()
        summary["sessions_s"] = round(time.monotonic() - t0, 1)
        summary["runs"] = [asdict(r) for r in runs]
        summary["passed"] = [r.name for r in runs if r.passed]
        ok = [x for x, r in zip(learners, runs, strict=True) if r.passed]
        if len(ok) >= 2:
            t1 = time.monotonic()
            timeout = CELL_TIMEOUT_S * scale
            try:
                summary["probes"] = {
                    ok[0].name: probe(ok[0], ok[1:], timeout),
                    ok[1].name: probe(ok[1], ok[:1], timeout),
                }
            except Exception as exc:  # noqa: BLE001
                summary["probes"] = {"error": f"{type(exc).__name__}: {exc}"[:4000]}
            summary["probes_s"] = round(time.monotonic() - t1, 1)
        summary["hub_log_tail"] = room.log_tail(200)
    summary["total_s"] = round(time.monotonic() - start, 1)
    return summary
