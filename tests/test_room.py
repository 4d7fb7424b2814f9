"""labkit.room: GPUs for a workshop room, and the doctor's line that reports them.

The rule is pure arithmetic over names, tested for boxes with 0, 2 and 8 GPUs and rooms of 1
to 8 learners; docker/room/jupyterhub_config.py calls it for every server it starts.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from labkit import room
from labkit.preflight.room import check_room_seat
from tests.ast_parse import parse

ROOT = Path(__file__).resolve().parents[1]


def learners(n: int) -> list[str]:
    return [f"learner{i}" for i in range(1, n + 1)]


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


@pytest.mark.parametrize("n_gpus", [0, 2, 8])
@pytest.mark.parametrize("n_learners", range(1, 9))
def test_every_learner_gets_a_seat_and_no_gpu_is_shared(n_gpus, n_learners):
    per = room.per_learner_for(n_gpus, n_learners)
    seats = room.assign_gpus(learners(n_learners), ids(n_gpus), per)
    assert list(seats) == learners(n_learners)
    given = [g for s in seats.values() for g in s.gpu_ids]
    assert len(given) == len(set(given)), "a GPU given twice"
    assert set(given) <= set(ids(n_gpus))
    with_gpus = [s for s in seats.values() if not s.cpu_only]
    assert all(len(s.gpu_ids) == per for s in with_gpus)
    # As many learners as whole blocks allow get GPUs; the rest run on the CPU and are told.
    assert len(with_gpus) == (min(n_learners, n_gpus // per) if n_gpus else 0)
    for seat in seats.values():
        if seat.cpu_only:
            assert "CPU" in seat.note
            assert seat.how == ("no gpus" if n_gpus == 0 else "gpus ran out")


@pytest.mark.parametrize(
    "n_gpus, n_learners, expected",
    [
        (8, 4, [("0", "1"), ("2", "3"), ("4", "5"), ("6", "7")]),  # 4 learners x 2
        (8, 8, [(str(i),) for i in range(8)]),  # 8 x 1
        (8, 3, [("0", "1"), ("2", "3"), ("4", "5")]),  # 8 // 3 = 2 each, 6 and 7 idle
        (2, 4, [("0",), ("1",), (), ()]),  # GPUs run out: learners 3 and 4 on the CPU
        (2, 1, [("0", "1")]),
        (0, 3, [(), (), ()]),
    ],
)
def test_blocks_of_neighbouring_gpus(n_gpus, n_learners, expected):
    per = room.per_learner_for(n_gpus, n_learners)
    seats = room.assign_gpus(learners(n_learners), ids(n_gpus), per)
    assert [s.gpu_ids for s in seats.values()] == expected


@pytest.mark.parametrize("n_gpus", [0, 2, 8])
def test_a_learner_who_arrives_later_never_moves_an_earlier_one(n_gpus):
    everyone = learners(8)
    full = room.assign_gpus(everyone, ids(n_gpus), per_learner=2)
    for k in range(1, 9):
        assert room.assign_gpus(everyone[:k], ids(n_gpus), per_learner=2) == {
            name: full[name] for name in everyone[:k]
        }


def test_the_table_comes_first_and_the_rest_is_dealt():
    table = {"learner3": ["6", "7"], "instructor": ["0"]}  # the instructor need not be present
    seats = room.assign_gpus(learners(4), ids(8), per_learner=2, table=table)
    assert seats["learner3"].gpu_ids == ("6", "7") and seats["learner3"].how == "table"
    assert seats["learner1"].gpu_ids == ("1", "2")
    assert seats["learner2"].gpu_ids == ("3", "4")
    assert seats["learner4"].cpu_only and "no GPU left" in seats["learner4"].note
    assert "8 GPUs" in seats["learner4"].note


@pytest.mark.parametrize(
    "table, says",
    [
        ({"a": ["9"]}, "does not have"),
        ({"a": ["0"], "b": ["0"]}, "to both a and b"),
    ],
)
def test_a_wrong_table_is_refused(table, says):
    with pytest.raises(ValueError, match=says):
        room.assign_gpus(["a", "b"], ids(2), table=table)


def test_other_refusals():
    with pytest.raises(ValueError, match="named twice"):
        room.assign_gpus(["a", "a"], ids(2))
    with pytest.raises(ValueError, match="at least one GPU"):
        room.assign_gpus(["a"], ids(2), per_learner=0)
    with pytest.raises(ValueError, match="room_size"):
        room.per_learner_for(8, 0)
    assert room.assign_gpus(["a"], [], per_learner=0)["a"].how == "no gpus"


def test_parse_table():
    assert room.parse_table(" alice = 0,1 ; bob=2 ;") == {"alice": ["0", "1"], "bob": ["2"]}
    assert room.parse_table("") == {}
    for bad in ("alice", "alice=", "=0"):
        with pytest.raises(ValueError, match="learner=id"):
            room.parse_table(bad)


def test_environment_and_docker_device_requests():
    seats = room.assign_gpus(["a", "b", "c"], ids(2), per_learner=1)
    env = room.seat_env(seats["b"])
    assert env == {
        "LABKIT_ROOM_LEARNER": "b",
        "LABKIT_ROOM_GPUS": "1",
        "LABKIT_ROOM_NOTE": "GPU 1 of the box is yours",
    }
    assert room.seat_env(seats["c"], visible_devices=True)["CUDA_VISIBLE_DEVICES"] == ""
    assert room.device_requests(seats["b"]) == [
        {"driver": "nvidia", "device_ids": ["1"], "capabilities": [["gpu"]]}
    ]
    assert room.device_requests(seats["c"]) == []


def test_the_module_stands_alone_for_the_hub():
    """The hub loads labkit/room.py by path, without labkit, torch or anything outside the
    standard library (its image installs none of them)."""
    tree = parse((ROOT / "labkit" / "room.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported
    path = str(ROOT / "labkit" / "room.py")
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('labkit_room', {path!r})\n"
        "mod = importlib.util.module_from_spec(spec); sys.modules['labkit_room'] = mod\n"
        "spec.loader.exec_module(mod)\n"
        "print(mod.assign_gpus(['a'], ['0'])['a'].gpu_ids, 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "('0',) False", out.stderr


# --- the doctor's line ---------------------------------------------------------------------


def seat_environ(learner: str, n_gpus: int, n_learners: int) -> dict[str, str]:
    seats = room.assign_gpus(
        learners(n_learners), ids(n_gpus), room.per_learner_for(n_gpus, n_learners)
    )
    return room.seat_env(seats[learner])


def test_no_line_outside_a_room():
    assert check_room_seat(0, {}) is None


@pytest.mark.parametrize(
    "n_gpus, n_learners, learner, usable, status, says",
    [
        (8, 4, "learner2", 2, "ok", "learner learner2: GPUs 2, 3 of the box are yours"),
        (8, 8, "learner8", 1, "ok", "GPU 7 of the box is yours (seen here as cuda:0..0)"),
        (2, 4, "learner3", 0, "warn", "no GPU left for you: the room's 2 GPUs went to"),
        (0, 4, "learner1", 0, "ok", "this room has no GPU: your ranks run on the CPU"),
        (2, 2, "learner1", 0, "warn", "but this server can use 0 GPU(s)"),
    ],
)
def test_the_doctor_says_what_the_room_gave(n_gpus, n_learners, learner, usable, status, says):
    check = check_room_seat(usable, seat_environ(learner, n_gpus, n_learners))
    assert check.status == status
    assert says in check.detail
    assert bool(check.fix) == (status != "ok")


def test_lk_doctor_shows_the_seat(monkeypatch):
    import labkit.preflight as preflight

    for key, value in seat_environ("learner3", 2, 4).items():
        monkeypatch.setenv(key, value)
    report = preflight.doctor()
    assert report["room seat"].status == "warn"
    assert "your ranks run on the CPU (gloo)" in " ".join(str(report).split())
    monkeypatch.delenv("LABKIT_ROOM_LEARNER")
    assert "room seat" not in {c.name for c in preflight.doctor().checks}
