"""A workshop room on one machine (issue 17): N learners at once, nothing shared, no flakes.

JupyterHub with docker/room/jupyterhub_config.py and a local spawner (tests/room/hub.py: a
system user and a network namespace per learner when run as root). Every learner signs up and
logs in through the hub's forms, starts a server, runs notebooks 00-04 (``fast``) and a
``%%ranks`` session in it; two of them also log in with headless Chromium and run a launch
cell; every learner's ``lk.doctor()`` states the GPUs the hub dealt (two made-up GPUs for
four learners: two get one each, two run on the CPU and are told so). Then the cross-talk
probes: a learner holding a live ``%%ranks`` world and a shared-memory segment, and the
others trying to reach them and running ``lk.doctor(kill_stale=True)``.

Takes several minutes on 2 cores, so it runs only when selected:

    make room-test                         # builds .room/ (venv, proxy), then the line below
    .room/venv/bin/python -m pytest -m room tests/room -v
    LABKIT_ROOM_LEARNERS_N=6 make room-test

benchmarks/room.py runs the same scenario for several N and records the figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.room import browser as room_browser
from tests.room.hub import isolation_blocker, missing
from tests.room.scenario import run_room

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("LABKIT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
N = int(os.environ.get("LABKIT_ROOM_LEARNERS_N", "4"))


@pytest.fixture(scope="module")
def summary(request):
    markexpr = request.config.getoption("-m") or ""
    if "room" not in markexpr or "not room" in markexpr:
        pytest.skip("the room test (several minutes): make room-test, or pytest -m room")
    why = missing()
    if why:
        pytest.skip(why)
    result = run_room(N, artifacts=ARTIFACTS)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"room-{N}.json").write_text(json.dumps(result, indent=1))
    return result


pytestmark = [pytest.mark.room, pytest.mark.slow, pytest.mark.timeout(3600)]


def test_every_learner_runs_the_course_and_a_ranks_session(summary):
    failed = {r["name"]: r["error"] for r in summary["runs"] if r["error"]}
    assert not failed, json.dumps(failed, indent=1) + "\n" + summary["hub_log_tail"]
    assert len(summary["passed"]) == N
    for run in summary["runs"]:
        assert {f"notebook {n}" for n in summary["notebooks"]} <= set(run["steps"])
        assert "[rank 0] 3.0 2" in run["ranks_output"] and "[rank 1] 3.0 2" in run["ranks_output"]


def test_two_learners_work_in_a_real_browser(summary):
    why = room_browser.available()
    if why:
        pytest.skip(why)
    assert summary["browser"] == {"lkroom1": True, "lkroom2": True}, summary["browser"]
    for name in ("lkroom1", "lkroom2"):
        assert (ARTIFACTS / f"room-{name}.png").stat().st_size > 10_000


def test_the_doctor_states_each_learners_gpus(summary):
    seats = {r["name"]: r["doctor"] for r in summary["runs"]}
    gpus = sorted(d["CUDA_VISIBLE_DEVICES"] for d in seats.values() if d["CUDA_VISIBLE_DEVICES"])
    assert gpus == ["0", "1"], seats  # two made-up GPUs, one each, in order of arrival
    for doctor in seats.values():
        seat = doctor["room seat"]
        if doctor["CUDA_VISIBLE_DEVICES"]:
            gpu = doctor["CUDA_VISIBLE_DEVICES"]
            # The GPU exists only on paper here: the doctor says the server cannot use it.
            assert f"GPU {gpu} of the box is yours; but this server can use 0 GPU(s)" in seat
            assert seat.startswith("warn")
        else:
            assert seat.startswith("warn") and "no GPU left for you: the room's 2 GPUs" in seat
        assert doctor["stale processes"].startswith("ok")


def test_no_learner_reaches_another(summary):
    probes = summary["probes"]
    assert "error" not in probes, probes
    for owner, seen in probes.items():
        zygote = seen["owner"]["zygote"]
        for prober, reached in seen.items():
            if prober == "owner":
                continue
            doctor_status, doctor_detail = reached["doctor"]
            assert doctor_status == "ok" and str(zygote) not in doctor_detail, reached
            if summary["isolated"]:
                # Own network namespace and uid: the store's port is not there, the segment
                # and the zygote belong to another user.
                assert reached["store"] == "ConnectionRefusedError", (owner, prober, reached)
                assert reached["segment"] == "PermissionError", (owner, prober, reached)
                assert reached["signal"] == "PermissionError", (owner, prober, reached)
            else:  # one uid and one loopback: only the doctor's restraint is labkit's to prove
                assert "left alone" in doctor_detail, reached


def test_isolation_level_is_reported(summary):
    blocker = isolation_blocker()
    assert summary["isolated"] == (blocker is None), blocker
