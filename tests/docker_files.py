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


def syntax_directive(text: str) -> str | None:
    """The ``# syntax=...`` parser directive: it counts only on the file's first lines."""
    for line in text.splitlines():
        m = re.fullmatch(r"#\s*syntax\s*=\s*(\S+)\s*", line)
        if m:
            return m[1]
        if not re.fullmatch(r"#\s*\w+\s*=.*", line):
            return None  # the first line that is not a directive ends them
    return None


def stages(instrs: list[tuple[str, str]]) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """The build stages: (name, what FROM names, instructions after FROM), in file order."""
    found = []
    for keyword, args in instrs:
        if keyword == "FROM":
            words = args.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else str(len(found))
            found.append((name, words[0], []))
        elif found:
            found[-1][2].append((keyword, args))
    return found


def target(instrs: list[tuple[str, str]], name: str | None = None) -> list[tuple[str, str]]:
    """What builds a target (``docker build --target NAME``; the last stage by default).

    The instructions of the stage and of the stages it is built FROM, in order, each stage
    starting with its FROM; the ARGs declared before the first FROM come first.
    """
    all_stages = stages(instrs)
    assert all_stages, "no FROM"
    by_name = {n: (base, body) for n, base, body in all_stages}
    name = name or all_stages[-1][0]
    assert name in by_name, f"no stage {name!r}"
    chain = []
    while name in by_name:
        base, body = by_name[name]
        chain.insert(0, [("FROM", base)] + body)
        name = base
    first_from = next(i for i, (k, _) in enumerate(instrs) if k == "FROM")
    return instrs[:first_from] + [i for part in chain for i in part]


def run_flags(args: str) -> tuple[list[dict[str, str]], str]:
    """A RUN's ``--mount=...`` flags (each as a dict) and the command after them."""
    mounts, rest = [], args
    while m := re.match(r"--(\w+)=(\S+)\s*", rest):
        if m[1] == "mount":
            mounts.append(
                dict(kv.split("=", 1) if "=" in kv else (kv, "") for kv in m[2].split(","))
            )
        rest = rest[m.end() :]
    return mounts, rest


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
    name, _, tag = image.split("@", 1)[0].rpartition("/")[2].partition(":")
    return bool(name) and bool(re.search(r"\d", tag)) and "latest" not in tag


def has_digest(image: str) -> bool:
    """An image reference that names its content: ``...@sha256:<64 hex digits>``."""
    return bool(re.search(r"@sha256:[0-9a-f]{64}$", image))


def check_base_image(instrs: list[tuple[str, str]]) -> str:
    """The base image is the ``BASE_IMAGE`` ARG, declared before FROM, its default pinned by
    tag and digest; every other FROM names an earlier stage."""
    first_from = next(i for i, (k, _) in enumerate(instrs) if k == "FROM")
    args = arg_defaults(instrs[:first_from])
    assert "BASE_IMAGE" in args, "declare ARG BASE_IMAGE=<image:tag@sha256:...> before FROM"
    assert instrs[first_from][1].split()[0] in ("${BASE_IMAGE}", "$BASE_IMAGE"), (
        "FROM ${BASE_IMAGE}"
    )
    assert is_pinned(args["BASE_IMAGE"]), f"BASE_IMAGE={args['BASE_IMAGE']} is not an exact tag"
    assert has_digest(args["BASE_IMAGE"]), f"BASE_IMAGE={args['BASE_IMAGE']} has no digest"
    seen: list[str] = []
    for name, base, _ in stages(instrs):
        assert base in ("${BASE_IMAGE}", "$BASE_IMAGE", *seen), (
            f"stage {name} is FROM {base}: only BASE_IMAGE or an earlier stage"
        )
        seen.append(name)
    return args["BASE_IMAGE"]


def check_shell(instrs: list[tuple[str, str]]) -> None:
    """``SHELL ["/bin/bash", "-o", "pipefail", "-c"]`` before the first RUN."""
    keys = [k for k, _ in instrs]
    assert "SHELL" in keys, "no SHELL instruction"
    at = keys.index("SHELL")
    assert json.loads(instrs[at][1]) == PIPEFAIL_SHELL, f"SHELL {instrs[at][1]}"
    assert "RUN" not in keys[:at], "a RUN before SHELL runs without pipefail"


def apt_pins(run: str) -> dict[str, dict[str, str]]:
    """The per-distribution pin table of an apt RUN: ``case "${VERSION_CODENAME}" in``
    branches ``codename) var='version' ... ;;`` (the ``*)`` branch under ``"*"``)."""
    m = re.search(r'case "\$\{VERSION_CODENAME\}" in (.*?) esac', run)
    assert m, 'pick the pins by distribution: case "${VERSION_CODENAME}" in ... esac'
    table = {}
    for branch in m[1].split(";;"):
        if ")" not in branch:
            continue
        label, _, body = branch.partition(")")
        pins = dict(re.findall(r"(\w+)='([^']*)'", body))
        if "exit" in body:
            pins["exit"] = body.split("exit", 1)[1].split()[0]
        table[label.strip()] = pins
    return table


def check_apt(instrs: list[tuple[str, str]], distros: tuple[str, ...] = ("noble",)) -> None:
    """apt installs: updated in the same RUN, no recommends, lists removed, every package
    pinned; pins chosen per distribution (each of ``distros`` has every version, any other
    distribution stops the build)."""
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
        variables = {v for p in packages for v in re.findall(r"\$\{(\w+)\}", p)}
        if not variables:
            continue  # literal pins: one distribution
        table = apt_pins(run)
        assert table.get("*", {}).get("exit", "0") != "0", "an unknown distribution must exit 1"
        for distro in distros:
            assert distro in table, f"no apt pins for {distro}"
            missing = variables - {v for v, value in table[distro].items() if value}
            assert not missing, f"{distro} has no pin for {sorted(missing)}"


def check_user(instrs: list[tuple[str, str]]) -> str:
    """The last USER is not root and comes after every RUN (root's RUNs hand their files to
    the learner); give it a target's instructions (:func:`target`)."""
    users = [i for i, (k, _) in enumerate(instrs) if k == "USER"]
    assert users, "no USER: the container would run as root"
    user = interpolate(instrs[users[-1]][1], arg_defaults(instrs)).split(":")[0]
    assert user and user not in ("root", "0"), f"the last USER is {user!r}"
    after = [k for k, _ in instrs[users[-1] + 1 :] if k != "FROM"]
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


def context_files(instrs: list[tuple[str, str]], i: int) -> list[str]:
    """What instruction ``i`` takes from the build context: COPY sources (without
    ``--from``), or the sources of RUN's bind mounts (no ``source``: the whole context)."""
    keyword, args = instrs[i]
    if keyword == "COPY":
        words = shlex.split(args)
        if any(w.startswith("--from") for w in words):
            return []
        return [w for w in words[:-1] if not w.startswith("--")]
    if keyword == "RUN":
        mounts, _ = run_flags(args)
        return [
            m.get("source", m.get("src", "."))
            for m in mounts
            if m.get("type") == "bind" and "from" not in m
        ]
    return []


def check_requirements(instrs: list[tuple[str, str]], expected: set[str]) -> None:
    """A target (:func:`target`) installs exactly the requirement files ``expected``, and
    nothing else (but the package itself, ``.``).

    Each file reaches the build on its own (COPY or a bind mount, never the whole context)
    before pip reads it, and the course (labkit/, notebooks/) comes only after the first
    install, so that editing it keeps the installed pins in the layer cache.
    """
    sources = {i: context_files(instrs, i) for i in range(len(instrs))}
    everything = [s for names in sources.values() for s in names if s.strip("/") in (".", "")]
    assert not everything, "COPY . or a bind mount of the whole context (.venv, .git)"
    arrived = {
        Path(s).name: i
        for i, names in sources.items()
        for s in names
        if Path(s).name.startswith("requirements")
    }
    runs = pip_runs(instrs)
    installed: dict[str, int] = {}
    for i in runs:
        _, command = run_flags(instrs[i][1])
        for cmd in command.split("&&"):
            if "pip install" not in cmd:
                continue
            words = shlex.split(cmd.split("pip install", 1)[1])
            for j, w in enumerate(words):
                if w in ("-r", "--requirement"):
                    installed.setdefault(Path(words[j + 1]).name, i)
                elif not w.startswith("-") and words[j - 1] not in ("-r", "--requirement"):
                    assert w == ".", f"pip installs {w!r} outside the requirement files"
    assert set(installed) == expected, (
        f"pip installs {sorted(installed)}, expected {sorted(expected)}"
    )
    for name, i in installed.items():
        assert name in arrived and arrived[name] <= i, (
            f"{name} is not in the build when pip reads it"
        )
    first_install = min(installed.values())
    course = [
        i
        for i, names in sources.items()
        if any(s.rstrip("/") in ("labkit", "notebooks") for s in names)
    ]
    assert len(course) >= 2, "labkit/ and notebooks/ must be copied"
    assert min(course) > first_install, "copy the course after installing the pins (layer cache)"


def user_at(instrs: list[tuple[str, str]], i: int) -> str:
    """The user instruction ``i`` runs as (``"0"`` before any USER)."""
    users = [a for k, a in instrs[:i] if k == "USER"]
    user = interpolate(users[-1], arg_defaults(instrs)).split(":")[0] if users else "0"
    return "0" if user == "root" else user


def check_venv(instrs: list[tuple[str, str]]) -> None:
    """The venv is the learner's: the RUNs that create or fill it run as the learner, or, as
    root, hand what they wrote to NB_UID in the same RUN (a later chown would copy the venv
    into a second layer)."""
    venv = arg_defaults(instrs).get("VIRTUAL_ENV") or dict(
        re.findall(r"(\w+)=(\S+)", " ".join(a for k, a in instrs if k == "ENV"))
    ).get("VIRTUAL_ENV")
    assert venv, "ENV VIRTUAL_ENV=..."
    venv_runs = [i for i, (k, a) in enumerate(instrs) if k == "RUN" and "-m venv" in a]
    assert venv_runs, "no venv is created"
    for i in sorted(set(pip_runs(instrs) + venv_runs)):
        if user_at(instrs, i) != "0":
            continue
        _, command = run_flags(instrs[i][1])
        gives = [c for c in command.split("&&") if "chown" in c and "${NB_UID}" in c]
        assert any("${VIRTUAL_ENV}" in c or venv in c for c in gives), (
            f"RUN {command[:60]}... writes the venv as root and leaves it root's"
        )
        parts = command.split("&&")
        last_pip = max(j for j, c in enumerate(parts) if "pip install" in c or "-m venv" in c)
        assert max(j for j, c in enumerate(parts) if c in gives) > last_pip, "chown after pip"


def check_pip_cache(text: str, instrs: list[tuple[str, str]]) -> None:
    """pip's downloads go to a BuildKit cache mount, never to a layer: the Dockerfile asks for
    the stable ``docker/dockerfile:1`` syntax, and the RUN that installs requirements.txt
    mounts a cache at the pip cache of the user it runs as, with no switch that disables it."""
    syntax = syntax_directive(text)
    assert syntax and re.fullmatch(r"docker/dockerfile:1(\.\d+)*(@sha256:[0-9a-f]{64})?", syntax), (
        f"first line: # syntax=docker/dockerfile:1 (found {syntax})"
    )
    runs = [i for i in pip_runs(instrs) if "requirements.txt" in instrs[i][1]]
    assert runs, "no pip install of requirements.txt"
    mounts, command = run_flags(instrs[runs[0]][1])
    caches = [m.get("target", m.get("dst", "")) for m in mounts if m.get("type") == "cache"]
    assert caches, "RUN --mount=type=cache,target=<pip's cache> for pip install"
    explicit = re.search(r"PIP_CACHE_DIR=(\S+)", command)
    as_root = user_at(instrs, runs[0]) == "0"
    wanted = explicit[1] if explicit else "/root/.cache/pip" if as_root else None
    assert wanted, "pip runs as a user: name its cache, PIP_CACHE_DIR=<the cache mount>"
    assert wanted in caches, f"the cache mount {caches} is not pip's cache, {wanted}"
    assert "--no-cache-dir" not in command, "--no-cache-dir defeats the cache mount"
    env = " ".join(a for k, a in instrs[: runs[0]] if k == "ENV")
    assert "PIP_NO_CACHE_DIR" not in env, "PIP_NO_CACHE_DIR defeats the cache mount"


def check_healthcheck(instrs: list[tuple[str, str]]) -> list[str]:
    """A target has a HEALTHCHECK in exec form with a timeout, whose command names no token
    (it reads JUPYTER_TOKEN inside the container); returns the command."""
    checks = [a for k, a in instrs if k == "HEALTHCHECK"]
    assert checks, "no HEALTHCHECK"
    last = checks[-1]
    assert last.strip().upper() != "NONE", "HEALTHCHECK NONE"
    options, _, command = last.partition("CMD")
    assert "--timeout=" in options and "--start-period=" in options, (
        "set --timeout and --start-period"
    )
    argv = json.loads(command)
    assert isinstance(argv, list), "HEALTHCHECK CMD in exec (JSON) form"
    assert not any("TOKEN" in w.upper() for w in argv), (
        "no token on the health check's command line"
    )
    return argv


def workdir(instrs: list[tuple[str, str]]) -> str:
    """The final WORKDIR, ARGs expanded."""
    return interpolate([a for k, a in instrs if k == "WORKDIR"][-1], arg_defaults(instrs))


def service(doc: dict) -> dict:
    """The compose service that publishes JupyterLab."""
    found = [s for s in doc.get("services", {}).values() if s.get("ports")]
    assert len(found) == 1, "expected one service that publishes a port"
    return found[0]


def check_compose(
    doc: dict,
    notebooks_target: str,
    compose_dir: Path = COMPOSE.parent,
    learner_target: str | None = None,
) -> None:
    """GPUs reserved, shared memory raised, loopback by default, a token, the notebooks mounted;
    the image built from the repository on a pinned base, as ``learner_target`` when given."""
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
    assert not base or (is_pinned(base) and has_digest(base)), f"compose builds on {base}"
    if learner_target:
        assert build.get("target", learner_target) == learner_target, (
            f"compose builds the {build.get('target')} target, not {learner_target}"
        )
