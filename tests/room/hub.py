"""A workshop room on this machine: JupyterHub with docker/room/jupyterhub_config.py and a
local spawner, learners as system users, each server in a network namespace of its own.

Two levels of isolation, chosen by what the machine allows:

- ``isolated`` (root, with ``useradd`` and ``ip netns``): a system user per learner
  (LocalProcessSpawner: servers, kernels and ranks run under the learner's uid) and a network
  namespace per learner (tests/room/netns_spawner.py), joined to the host by a veth pair with
  addresses from 198.18.0.0/15 (RFC 2544's range for test networks) that exist only inside
  this machine: learner i's server listens on 198.18.i.2, the hub's API on 198.18.255.1. A
  learner's namespace routes only to the hub, so it cannot reach another learner at all, and
  its loopback (rendezvous store, gloo) is its own, as in one container per learner.
- ``shared`` (otherwise): SimpleLocalProcessSpawner, every server as this user on 127.0.0.1.
  Each learner still has a server, a notebook copy and a login; but one uid and one loopback
  for all, so another learner's store, segments and zygote are within reach: the test then
  checks only what labkit itself guarantees (the doctor spares a live peer's zygote).

The hub's public port, its API port and the proxy's API port are chosen free on 127.0.0.1;
the proxy is configurable-http-proxy from npm (``make room-test`` installs it under .room/).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "docker" / "room" / "jupyterhub_config.py"
CHP_DIR = ROOT / ".room" / "node_modules" / ".bin"
PREFIX = "lkroom"  # system users and network namespaces: lkroom1, lkroom2, ...
HUB_NET = "198.18.255.1"  # the hub's API, on the host side, reached from every namespace


def proxy_binary() -> str | None:
    """configurable-http-proxy: from ``make room-test``'s .room/, else on PATH."""
    here = CHP_DIR / "configurable-http-proxy"
    return str(here) if here.exists() else shutil.which("configurable-http-proxy")


def missing() -> str | None:
    """Why a room cannot run here, or None."""
    if shutil.which("jupyterhub", path=str(Path(sys.executable).parent)) is None:
        return "jupyterhub is not installed in this venv (pip install -r requirements-dev.txt)"
    chp = proxy_binary()
    if chp is None:
        return "configurable-http-proxy not found: `make room-proxy` installs it with npm"
    try:  # an install cut short can leave a link to a proxy that cannot start
        subprocess.run([chp, "--version"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as e:
        return f"configurable-http-proxy at {chp} does not run ({e}): `make room-proxy` again"
    return None


def open_to_others(path: Path) -> bool:
    """Whether another user can reach ``path`` (every folder above it searchable by others)."""
    real = Path(os.path.realpath(path))
    return all(part.stat().st_mode & stat.S_IXOTH for part in (real, *real.parents))


def isolation_blocker() -> str | None:
    """Why learners cannot have a system user and a network namespace each here, or None."""
    if os.geteuid() != 0:
        return "not root: no useradd, no network namespaces"
    tools = [t for t in ("useradd", "userdel", "ip") if not shutil.which(t)]
    if tools:
        return f"{', '.join(tools)} not found"
    for what, path in (("this venv's python", Path(sys.executable)), ("the checkout", ROOT)):
        if not open_to_others(path):
            return (
                f"{what} ({os.path.realpath(path)}) is in a folder other users cannot enter: "
                "make room-test builds .room/venv on /usr/bin/python3 for that"
            )
    return None


def can_isolate() -> bool:
    """A system user and a network namespace per learner (see :func:`isolation_blocker`)."""
    return isolation_blocker() is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


@dataclass
class Room:
    """A running hub and its learners' names, passwords and (isolated) addresses."""

    url: str
    names: list[str]
    passwords: dict[str, str]
    isolated: bool
    work: Path
    log: Path
    gpu_ids: list[str]
    addresses: dict[str, str] = field(default_factory=dict)
    uids: dict[str, int] = field(default_factory=dict)

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def _make_netns(i: int, name: str) -> str:
    host, inner = f"{PREFIX}{i}h", f"{PREFIX}{i}n"
    _run("ip", "netns", "add", name)
    _run("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
    _run("ip", "link", "set", inner, "netns", name)
    _run("ip", "addr", "add", f"198.18.{i}.1/30", "dev", host)
    _run("ip", "link", "set", host, "up")
    _run("ip", "-n", name, "addr", "add", f"198.18.{i}.2/30", "dev", inner)
    _run("ip", "-n", name, "link", "set", inner, "up")
    _run("ip", "-n", name, "link", "set", "lo", "up")
    _run("ip", "-n", name, "route", "add", f"{HUB_NET}/32", "via", f"198.18.{i}.1")
    return f"198.18.{i}.2"


def _drop_netns(i: int, name: str) -> None:
    for argv in (("ip", "netns", "del", name), ("ip", "link", "del", f"{PREFIX}{i}h")):
        subprocess.run(argv, capture_output=True, timeout=60)


def _hub_link(up: bool) -> None:
    if up:
        _run("ip", "link", "add", f"{PREFIX}hub0", "type", "veth", "peer", "name", f"{PREFIX}hub1")
        _run("ip", "addr", "add", f"{HUB_NET}/32", "dev", f"{PREFIX}hub0")
        _run("ip", "link", "set", f"{PREFIX}hub0", "up")
        _run("ip", "link", "set", f"{PREFIX}hub1", "up")
    else:
        subprocess.run(("ip", "link", "del", f"{PREFIX}hub0"), capture_output=True, timeout=60)


def _wait_up(proc: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyterhub exited ({proc.returncode}):\n{log.read_text()}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            with urllib.request.urlopen(url + "hub/api/", timeout=5) as resp:
                if resp.status == 200:
                    return
        time.sleep(0.5)
    raise TimeoutError(f"the hub did not answer within {timeout:.0f} s:\n{log.read_text()}")


def _processes_of(uids: set[int]) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["uids"]):
        uids_now = p.info.get("uids")
        if uids_now is not None and uids_now.real in uids:
            found.append(p)
    return found


def _end(processes: list[psutil.Process], grace_s: float = 10.0) -> None:
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


@contextlib.contextmanager
def running_room(
    n: int,
    isolated: bool | None = None,
    gpu_ids: tuple[str, ...] = ("0", "1"),
    scale: float = 1.0,
    keep: Path | None = None,
) -> Iterator[Room]:
    """Start a hub for ``n`` learners (their accounts are made by signing up), stop it after.

    Args:
        n: learners on the roster (``lkroom1`` ... ``lkroomN``).
        isolated: a system user and a network namespace per learner (default: when root).
        gpu_ids: the GPUs the hub deals (none exist here: the seats are checked, not used).
        scale: how much slower than one learner the box is expected to be (timeouts grow).
        keep: copy the hub's log here at the end.

    Yields:
        The :class:`Room`.
    """
    isolated = can_isolate() if isolated is None else isolated
    names = [f"{PREFIX}{i}" for i in range(1, n + 1)]
    work = Path(tempfile.mkdtemp(prefix="labkit-room-"))
    work.chmod(0o755)  # the learners' homes live below it
    hub_dir = work / "hub"
    hub_dir.mkdir(mode=0o700)
    log = hub_dir / "jupyterhub.log"
    room = Room(
        url=f"http://127.0.0.1:{free_port()}/",
        names=names,
        passwords={name: secrets.token_urlsafe(12) for name in names},
        isolated=isolated,
        work=work,
        log=log,
        gpu_ids=list(gpu_ids),
    )
    proc = None
    made_users: list[str] = []
    made_ns: list[tuple[int, str]] = []
    try:
        env = dict(os.environ)
        env.pop("JUPYTER_TOKEN", None)
        env.update(
            LABKIT_ROOM_SPAWNER="local",
            LABKIT_ROOM_DATA=str(hub_dir),
            LABKIT_ROOM_URL=room.url.rstrip("/"),
            LABKIT_ROOM_LEARNERS=",".join(names),
            LABKIT_ROOM_GPU_IDS=",".join(gpu_ids),
            LABKIT_ROOM_GPUS_PER_LEARNER="1",
            LABKIT_ROOM_NOTEBOOKS=str(ROOT / "notebooks"),
            LABKIT_ROOM_TIMEOUT_SCALE=f"{scale:.1f}",  # lk.stretch in every learner's ranks
            LABKIT_ROOM_START_TIMEOUT=str(int(180 * scale)),
            LABKIT_ROOM_HTTP_TIMEOUT=str(int(120 * scale)),
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        )
        chp = proxy_binary()
        if chp:
            env["PATH"] = os.pathsep.join([str(Path(chp).parent), env["PATH"]])
        if isolated:
            home = work / "home"
            home.mkdir(mode=0o755)
            _hub_link(True)
            for i, name in enumerate(names, start=1):
                _run("useradd", "--create-home", "--home-dir", str(home / name), name)
                made_users.append(name)
                room.uids[name] = int(
                    subprocess.run(["id", "-u", name], capture_output=True, text=True).stdout
                )
                room.addresses[name] = _make_netns(i, name)
                made_ns.append((i, name))
            env.update(
                LABKIT_ROOM_LOCAL_SPAWNER="tests.room.netns_spawner.NetnsSpawner",
                LABKIT_ROOM_HUB_IP=HUB_NET,
                LABKIT_ROOM_NETNS=json.dumps(room.addresses),
            )
        argv = [
            str(Path(sys.executable).parent / "jupyterhub"),
            "-f",
            str(CONFIG),
            f"--JupyterHub.hub_port={free_port()}",
            f"--ConfigurableHTTPProxy.api_url=http://127.0.0.1:{free_port()}",
        ]
        with log.open("w") as out:
            proc = subprocess.Popen(
                argv, cwd=hub_dir, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        _wait_up(proc, room.url, log, 120 * scale)
        yield room
    finally:
        if proc is not None:
            proc.terminate()  # cleanup_servers: the hub stops every learner's server
            try:
                proc.wait(timeout=60 * scale)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if keep is not None and log.exists():
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(log, keep / "jupyterhub.log")
        if room.uids:
            _end(_processes_of(set(room.uids.values())))
        for name in made_users:
            subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)
        for i, name in made_ns:
            _drop_netns(i, name)
        if isolated:
            _hub_link(False)
        shutil.rmtree(work, ignore_errors=True)
