"""Checks of the workshop image's files, read as text: no Docker engine needed.

Each ``check_*`` function raises AssertionError naming what is wrong. ``tests/test_docker.py``
runs them on ``docker/Dockerfile`` and ``docker/compose.yaml``, and on broken copies of
both to show that each check can fail.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE = ROOT / "docker" / "compose.yaml"
PIPEFAIL_SHELL = ["/bin/bash", "-o", "pipefail", "-c"]
_VAR = re.compile(r"\$\{(?P<name>\w+)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>\w+)")


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile as (KEYWORD, arguments), continuation lines joined, comments dropped."""
    found, buf = [], ""
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue  # also inside a continuation, as Docker does
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        keyword, _, rest = (buf + s).partition(" ")
        found.append((keyword.upper(), rest.strip()))
        buf = ""
    return found


def interpolate(value: str, env: dict[str, str]) -> str:
    """Expand ``$VAR``, ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?error}`` like compose/sh.

    Raises:
        ValueError: a required variable (``:?``/``?``) is unset (or empty, for ``:?``).
    """

    def one(m: re.Match) -> str:
        name = m["name"] or m["bare"]
        op, arg, val = m["op"], m["arg"] or "", env.get(name)
        missing = val is None or (op is not None and op.startswith(":") and val == "")
        if op and op.endswith("-"):
            return arg if missing else val
        if op and op.endswith("?"):
            if missing:
                raise ValueError(f"{name}: {arg}")
            return val
        return val or ""

    return _VAR.sub(one, value)


def arg_defaults(instrs: list[tuple[str, str]]) -> dict[str, str]:
    """Every ``ARG NAME=default`` of the Dockerfile."""
    return dict(a.split("=", 1) for k, a in instrs if k == "ARG" and "=" in a)


def is_pinned(image: str) -> bool:
    """An image reference with an exact tag: a tag with a digit, never ``latest``."""
    name, _, tag = image.rpartition("/")[2].partition(":")
    return bool(name) and bool(re.search(r"\d", tag)) and "latest" not in tag


def check_base_image(instrs: list[tuple[str, str]]) -> str:
    """The base image is the ``BASE_IMAGE`` ARG, declared before FROM with a pinned default."""
    first_from = next(i for i, (k, _) in enumerate(instrs) if k == "FROM")
    args = arg_defaults(instrs[:first_from])
    assert "BASE_IMAGE" in args, "declare ARG BASE_IMAGE=<image:tag> before FROM"
    assert instrs[first_from][1].split()[0] in ("${BASE_IMAGE}", "$BASE_IMAGE"), (
        "FROM ${BASE_IMAGE}"
    )
    assert is_pinned(args["BASE_IMAGE"]), f"BASE_IMAGE={args['BASE_IMAGE']} is not an exact tag"
    return args["BASE_IMAGE"]


def check_shell(instrs: list[tuple[str, str]]) -> None:
    """``SHELL ["/bin/bash", "-o", "pipefail", "-c"]`` before the first RUN."""
    keys = [k for k, _ in instrs]
    assert "SHELL" in keys, "no SHELL instruction"
    at = keys.index("SHELL")
    assert json.loads(instrs[at][1]) == PIPEFAIL_SHELL, f"SHELL {instrs[at][1]}"
    assert "RUN" not in keys[:at], "a RUN before SHELL runs without pipefail"


def check_apt(instrs: list[tuple[str, str]]) -> None:
    """apt installs: updated in the same RUN, no recommends, every package pinned, lists removed."""
    runs = [a for k, a in instrs if k == "RUN" and "apt-get install" in a]
    assert runs, "no apt-get install found"
    for run in runs:
        assert "apt-get update" in run, "apt-get update belongs in the RUN that installs"
        assert "--no-install-recommends" in run, "apt-get install without --no-install-recommends"
        assert "rm -rf /var/lib/apt/lists/*" in run, "the RUN must remove /var/lib/apt/lists/*"
        words = run.split("apt-get install", 1)[1].split("&&")[0].split()
        packages = [w for w in words if not w.startswith("-")]
        assert packages, "no package named"
        unpinned = [p for p in packages if "=" not in p]
        assert not unpinned, f"unpinned apt packages: {unpinned}"


def check_user(instrs: list[tuple[str, str]]) -> str:
    """The last USER is not root and comes after every RUN."""
    users = [i for i, (k, _) in enumerate(instrs) if k == "USER"]
    assert users, "no USER: the container would run as root"
    user = interpolate(instrs[users[-1]][1], arg_defaults(instrs)).split(":")[0]
    assert user and user not in ("root", "0"), f"the last USER is {user!r}"
    after = [k for k, _ in instrs[users[-1] + 1 :]]
    assert "RUN" not in after, "a RUN after the last USER: switch to the user at the end"
    return user


def cmd_argv(instrs: list[tuple[str, str]]) -> list[str]:
    """The CMD in exec form, as a list."""
    cmds = [a for k, a in instrs if k == "CMD"]
    assert cmds, "no CMD"
    argv = json.loads(cmds[-1])
    assert isinstance(argv, list), "CMD must be in exec (JSON) form"
    return argv


def check_token(instrs: list[tuple[str, str]]) -> None:
    """JupyterLab is the default command and cannot start without a token."""
    line = " ".join(cmd_argv(instrs))
    assert "jupyter lab" in line, "the default command must start JupyterLab"
    assert "${JUPYTER_TOKEN:?" in line, "the command must stop when JUPYTER_TOKEN is unset"
    assert not re.search(r"token=(''|\"\"|\s|$)", line), "an empty token disables the login"


def pip_runs(instrs: list[tuple[str, str]]) -> list[int]:
    return [i for i, (k, a) in enumerate(instrs) if k == "RUN" and "pip install" in a]


def check_requirements(instrs: list[tuple[str, str]], env_files: set[str]) -> None:
    """The image installs exactly the requirement files environment.yml reads, and nothing else.

    Those files are copied on their own, installed, and only then comes the course (late copy).
    """
    copies = [(i, shlex.split(a)) for i, (k, a) in enumerate(instrs) if k == "COPY"]
    srcs = [(i, [w for w in ws[:-1] if not w.startswith("--")]) for i, ws in copies]
    assert all("." not in s for _, s in srcs), "COPY . copies the whole context (.venv, .git)"
    req_copies = [(i, s) for i, s in srcs if any(x.startswith("requirements") for x in s)]
    assert req_copies, "the requirement files are never copied"
    copied = {x for _, s in req_copies for x in s}
    assert copied == env_files, (
        f"image copies {sorted(copied)}, environment.yml {sorted(env_files)}"
    )
    runs = pip_runs(instrs)
    installed = set()
    for i in runs:
        for cmd in instrs[i][1].split("&&"):
            if "pip install" not in cmd:
                continue
            words = shlex.split(cmd.split("pip install", 1)[1])
            for j, w in enumerate(words):
                if w in ("-r", "--requirement"):
                    installed.add(Path(words[j + 1]).name)
                elif not w.startswith("-") and words[j - 1] not in ("-r", "--requirement"):
                    assert w == ".", f"pip installs {w!r} outside the requirement files"
    assert installed == env_files, f"pip installs {sorted(installed)}, expected {sorted(env_files)}"
    first_req_run = next(i for i in runs if "requirement" in instrs[i][1] or " -r " in instrs[i][1])
    assert max(i for i, _ in req_copies) < first_req_run
    course = [i for i, s in srcs if any(x.rstrip("/") in ("labkit", "notebooks") for x in s)]
    assert len(course) >= 2, "labkit/ and notebooks/ must be copied"
    assert min(course) > first_req_run, "copy the course after installing the pins (layer cache)"


def workdir(instrs: list[tuple[str, str]]) -> str:
    """The final WORKDIR, ARGs expanded."""
    return interpolate([a for k, a in instrs if k == "WORKDIR"][-1], arg_defaults(instrs))


def service(doc: dict) -> dict:
    """The compose service that publishes JupyterLab."""
    found = [s for s in doc.get("services", {}).values() if s.get("ports")]
    assert len(found) == 1, "expected one service that publishes a port"
    return found[0]


def check_compose(doc: dict, notebooks_target: str, compose_dir: Path = COMPOSE.parent) -> None:
    """GPUs reserved, shared memory raised, loopback by default, a token, the notebooks mounted."""
    svc = service(doc)
    devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    assert any(
        d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devices
    ), "reserve the GPUs: deploy.resources.reservations.devices, driver nvidia, [gpu]"
    shm = str(svc.get("shm_size", "0")).lower()
    m = re.fullmatch(r"(\d+)\s*([kmg]?)b?", shm)
    shm_bytes = int(m[1]) * 1024 ** " kmg".index(m[2] or " ") if m else 0
    assert svc.get("ipc") == "host" or shm_bytes >= 2**30, "ipc: host or shm_size >= 1gb for NCCL"
    for port in svc["ports"]:
        assert isinstance(port, str), f"{port!r}: write ports as HOST_IP:PORT:PORT"
        resolved = interpolate(port, {})
        assert resolved.count(":") == 2, f"{port!r}: bind a host address, HOST_IP:PORT:PORT"
        assert resolved.split(":")[0] == "127.0.0.1", f"{port!r} is not loopback by default"
        names = [m["name"] or m["bare"] for m in _VAR.finditer(port)]
        opened = [n for n in names if interpolate(port, {n: "0.0.0.0"}).startswith("0.0.0.0:")]
        assert opened, f"{port!r}: no variable lets the instructor open it to the room"
    env = svc.get("environment", {})
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    assert "JUPYTER_TOKEN" in env, "pass JUPYTER_TOKEN to the container"
    for unset in ({}, {"JUPYTER_TOKEN": ""}):
        try:
            interpolate(str(env["JUPYTER_TOKEN"]), unset)
        except ValueError:
            continue
        raise AssertionError("JUPYTER_TOKEN must be required: ${JUPYTER_TOKEN:?message}")
    mounts = [str(v).split(":") for v in svc.get("volumes", [])]
    notebooks = [m for m in mounts if len(m) >= 2 and m[1] == notebooks_target]
    assert notebooks, f"mount the notebooks at {notebooks_target}"
    assert (compose_dir / notebooks[0][0]).resolve() == ROOT / "notebooks"
    build = svc.get("build", {})
    assert (compose_dir / build.get("context", ".")).resolve() == ROOT, "build from the repo root"
    assert build.get("dockerfile") == "docker/Dockerfile"
    base = interpolate(str(build.get("args", {}).get("BASE_IMAGE", "")), {})
    assert not base or is_pinned(base), f"compose builds on {base}"
