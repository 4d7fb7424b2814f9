"""One set of versions: requirements*.txt pins them; pyproject and environment.yml follow."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+)==(?P<version>[0-9][^\s;#]*)$")


def pins(path: Path) -> dict[str, str]:
    found = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = PIN.match(line)
        assert m, f"{path.name}: {raw!r} is not an exact pin (name==version)"
        found[m["name"].lower().replace("_", "-")] = m["version"]
    return found


def test_every_requirement_is_pinned_and_torch_is_the_course_pin():
    runtime = pins(ROOT / "requirements.txt")
    dev = pins(ROOT / "requirements-dev.txt")
    assert runtime["torch"] == "2.13.0"
    for name in ("jupyterlab", "ipywidgets", "matplotlib", "papermill"):
        assert name in runtime, f"{name} must be pinned in requirements.txt"
    for name in ("pytest", "nbval"):
        assert name in dev, f"{name} must be pinned in requirements-dev.txt"
    assert not set(runtime) & set(dev), "a package pinned in both files"


def test_pyproject_reads_the_same_files():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dyn = project["tool"]["setuptools"]["dynamic"]
    assert dyn["dependencies"]["file"] == ["requirements.txt"]
    assert dyn["optional-dependencies"]["test"]["file"] == ["requirements-dev.txt"]
    assert "dependencies" not in project["project"], "pins belong in requirements.txt only"


def test_environment_yml_follows_the_pins():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = env["dependencies"]
    pip_section = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    assert "-r requirements.txt" in pip_section
    assert "-r requirements-dev.txt" in pip_section
    python = next(d for d in deps if isinstance(d, str) and d.startswith("python"))
    version = python.split("=")[-1]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = project["requires-python"]
    lo, hi = re.findall(r"[\d.]+", spec)
    as_tuple = lambda v: tuple(int(x) for x in v.split("."))  # noqa: E731
    assert as_tuple(lo) <= as_tuple(version) < as_tuple(hi), f"python={version} vs {spec}"
    # Anything conda installs itself must agree with the pip pins.
    runtime = pins(ROOT / "requirements.txt") | pins(ROOT / "requirements-dev.txt")
    for d in deps:
        if isinstance(d, str) and not d.startswith(("python", "pip")):
            name, _, ver = d.partition("=")
            assert name.lower() in runtime, f"environment.yml adds unpinned {name}"
            assert ver.lstrip("=") == runtime[name.lower()], f"{name}: {ver} vs the pin"
    for line in pip_section:
        assert line.startswith(("-r ", "-e ")), f"environment.yml pins {line!r} on its own"


@pytest.mark.parametrize("req", ["requirements.txt", "requirements-dev.txt"])
def test_installed_versions_match_the_pins(req):
    """The environment under test is the pinned one (a stale venv fails here, not later)."""
    for name, version in pins(ROOT / req).items():
        installed = metadata.version(name).split("+")[0]
        assert installed == version, f"{name}: installed {installed}, pinned {version}"
