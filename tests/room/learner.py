"""What each learner does in the room test, and the cross-talk probes between two learners.

A learner signs up and logs in through the hub's forms, starts a server, runs notebooks in it
(each in a fresh kernel, every code cell in order, ``fast = True`` after the parameters cell,
as ``labkit course run --fast`` does through papermill), a ``%%ranks`` session, and
``lk.doctor()``, whose "room seat" line must state what the hub gave them.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from tests.room.client import Learner

ROOT = Path(__file__).resolve().parents[2]
COURSE = ["00", "01", "02", "03", "04"]
CELL_TIMEOUT_S = 300.0  # one learner alone; multiplied by the room's load scale

RANKS_SESSION = [
    "%load_ext labkit",
    "%ranks start 2",
    "%%ranks\nimport torch, torch.distributed as dist\n"
    "x = torch.ones(1) * (rank + 1)\ndist.all_reduce(x)\nprint(x.item(), dist.get_world_size())",
    "%ranks stop",
]

DOCTOR = (
    "import os, labkit as lk\n"
    "report = lk.doctor()\n"
    "for name in ('room seat', 'stale processes'):\n"
    "    c = report[name]\n"
    "    print(name, '|', c.status, '|', ' '.join(c.detail.split()))\n"
    "print('CUDA_VISIBLE_DEVICES |', os.environ.get('CUDA_VISIBLE_DEVICES'))\n"
)


@dataclass
class LearnerRun:
    """Timings (seconds) and the outcome of one learner's session."""

    name: str
    steps: dict[str, float] = field(default_factory=dict)
    doctor: dict[str, str] = field(default_factory=dict)
    ranks_output: str = ""
    error: str = ""

    @property
    def passed(self) -> bool:
        return not self.error


def notebook_path(number: str) -> Path:
    return next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))


def with_fast(source: str) -> str:
    """A parameters cell with ``fast = True`` appended, when it declares ``fast``."""
    if re.search(r"^fast\s*[:=]", source, re.M):
        return source.rstrip("\n") + "\nfast = True  # set by the room test"
    return source


def run_notebook(learner: Learner, number: str, timeout: float) -> None:
    """Every code cell of notebook ``number`` in a fresh kernel of the learner's server."""
    nb = nbformat.read(notebook_path(number), as_version=4)
    kernel = learner.kernel()
    try:
        for cell in nb.cells:
            if cell.cell_type != "code" or not cell.source.strip():
                continue
            source = cell.source
            if "parameters" in cell.metadata.get("tags", []):
                source = with_fast(source)
            kernel.run(source, timeout)
    finally:
        kernel.close()


def run_ranks_session(learner: Learner, timeout: float) -> str:
    kernel = learner.kernel()
    try:
        return "".join(kernel.run(cell, timeout) for cell in RANKS_SESSION)
    finally:
        kernel.close()


def run_doctor(learner: Learner, timeout: float) -> dict[str, str]:
    kernel = learner.kernel()
    try:
        text = kernel.run(DOCTOR, timeout)
    finally:
        kernel.close()
    return {k.strip(): v.strip() for k, _, v in (line.partition("|") for line in text.splitlines())}


def session(
    learner: Learner, scale: float, notebooks: list[str], ready=None, run: LearnerRun | None = None
) -> LearnerRun:
    """A learner's whole session; errors are recorded in the result, not raised."""
    run = run or LearnerRun(learner.name)
    timeout = CELL_TIMEOUT_S * scale

    def step(name: str, fn, *args):
        start = time.monotonic()
        out = fn(*args)
        run.steps[name] = round(time.monotonic() - start, 1)
        return out

    try:
        message = step("sign up", learner.sign_up)
        assert message.startswith("The signup was successful"), message
        assert step("log in", learner.log_in), f"{learner.name}: the login was refused"
        learner.make_token()
        step("server start", learner.start_server, 180 * scale)
        if ready is not None:
            ready.set()
        for number in notebooks:
            step(f"notebook {number}", run_notebook, learner, number, timeout)
        run.ranks_output = step("%%ranks session", run_ranks_session, learner, timeout)
        run.doctor = step("doctor", run_doctor, learner, timeout)
    except Exception as exc:  # noqa: BLE001 - reported per learner
        run.error = f"{type(exc).__name__}: {exc}"[:4000]
    finally:
        if ready is not None:
            ready.set()
    return run


# --- cross-talk: what one learner can reach of another's --------------------------------------

OWNER = """\
%load_ext labkit
%ranks start 2
"""
OWNER_INFO = """\
import json, os, socket
from labkit.launcher import current_zygote_pid
port = int(_port)
# A segment made as labkit_shm makes its own: O_CREAT | O_EXCL, owner-only 0600.
segment = f"/dev/shm/labkit-shm-{os.getuid()}-{os.getpid()}-roomprobe"
os.close(os.open(segment, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
socket.create_connection(("127.0.0.1", port), timeout=5).close()  # the owner reaches its store
print(json.dumps({"port": port, "zygote": current_zygote_pid(), "segment": segment,
                  "uid": os.getuid()}))
"""
PROBE = """\
import json, os, socket, labkit as lk
target = json.loads({target!r})
seen = {{}}
try:
    socket.create_connection(("127.0.0.1", target["port"]), timeout=5).close()
    seen["store"] = "reached"
except OSError as e:
    seen["store"] = type(e).__name__
try:
    open(target["segment"], "rb").close()
    seen["segment"] = "opened"
except OSError as e:
    seen["segment"] = type(e).__name__
try:
    os.kill(target["zygote"], 0)
    seen["signal"] = "allowed"
except OSError as e:
    seen["signal"] = type(e).__name__
check = lk.doctor(kill_stale=True)["stale processes"]
seen["doctor"] = [check.status, " ".join(check.detail.split())]
print(json.dumps(seen))
"""
OWNER_AFTER = """\
import os, psutil
from labkit.launcher import current_zygote_pid
assert current_zygote_pid() == target_zygote and psutil.Process(target_zygote).is_running()
os.unlink(segment)
"""


def probe(owner: Learner, probers: list[Learner], timeout: float) -> dict[str, dict]:
    """The owner holds a %%ranks world (zygote, ranks, store) and a segment; each prober tries
    to reach them and runs ``lk.doctor(kill_stale=True)``; the owner's world must still work.

    Returns:
        prober name -> what it reached: {"store", "segment", "signal", "doctor"}, plus
        ``"owner"``: the owner's resources.
    """
    kernel = owner.kernel()
    found: dict[str, dict] = {}
    try:
        kernel.run(OWNER, timeout)
        port = kernel.run("%%ranks 0\nimport os\nprint(os.environ['MASTER_PORT'])", timeout)
        port = re.search(r"(\d+)\s*$", port.strip()).group(1)
        kernel.run(f"_port = {port}", timeout)
        target = kernel.run(OWNER_INFO, timeout).strip().splitlines()[-1]
        found["owner"] = json.loads(target)
        for prober in probers:
            pk = prober.kernel()
            try:
                out = pk.run(PROBE.format(target=target), timeout)
                found[prober.name] = json.loads(out.strip().splitlines()[-1])
            finally:
                pk.close()
        kernel.run(f"target_zygote = {found['owner']['zygote']}", timeout)
        kernel.run(OWNER_AFTER, timeout)
        after = kernel.run(RANKS_SESSION[2], timeout)  # the world survived the probes
        assert "3.0 2" in after, after
        kernel.run("%ranks stop", timeout)
    finally:
        kernel.close()
    return found
