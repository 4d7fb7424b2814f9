"""A throw-away JupyterLab server on loopback for the browser test, and process bookkeeping."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

JUPYTER = Path(sys.executable).parent / "jupyter"
START_TIMEOUT_S = 90.0  # a loaded 2-core machine takes 10-40 s to bring JupyterLab up


@dataclass(frozen=True)
class Lab:
    """A running server: where it listens and the token it asks for."""

    url: str  # http://127.0.0.1:PORT/
    token: str
    log: Path


# Start the notebook's kernel without the "Select Kernel" dialog, and no "news?" toast over
# the screenshot: what a learner clicks once, set before the page loads.
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false"},
}


def write_settings(folder: Path) -> Path:
    """JupyterLab user settings (``SETTINGS``) written under ``folder``; returns it."""
    for plugin, values in SETTINGS.items():
        path = folder / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    return folder


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _request(url: str, token: str, method: str = "GET") -> int:
    req = urllib.request.Request(url, method=method, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return resp.status


def wait_for_kernel(lab: Lab, timeout_s: float = START_TIMEOUT_S) -> None:
    """Wait until a kernel is idle with a browser connected (before that, Run All does nothing)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        req = urllib.request.Request(
            lab.url + "api/kernels", headers={"Authorization": f"token {lab.token}"}
        )
        with urllib.request.urlopen(req, timeout=5) as resp:
            kernels = json.load(resp)
        if any(k["execution_state"] == "idle" and k["connections"] > 0 for k in kernels):
            return
        time.sleep(0.5)
    raise TimeoutError(f"no kernel ready after {timeout_s} s:\n{lab.log.read_text()}")


def _wait_ready(proc: subprocess.Popen, lab: Lab) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"JupyterLab exited ({proc.returncode}):\n{lab.log.read_text()}")
        with contextlib.suppress(OSError, urllib.error.URLError):
            if _request(lab.url + "api/status", lab.token) == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"JupyterLab not up after {START_TIMEOUT_S} s:\n{lab.log.read_text()}")


def descendants(pid: int | None = None) -> set[psutil.Process]:
    """Every live process below ``pid`` (default: this one)."""
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.NoSuchProcess:
        return set()


def end(processes: set[psutil.Process], grace_s: float = 5.0) -> None:
    """Terminate, then kill, the given processes (those already gone are skipped)."""
    alive = [p for p in processes if p.is_running()]
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.terminate()
    _, alive = psutil.wait_procs(alive, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


@contextlib.contextmanager
def running_lab(notebook_dir: Path, work: Path) -> Iterator[Lab]:
    """Start ``jupyter lab`` on 127.0.0.1 with a random token; stop it and all it started.

    Configuration, runtime and IPython folders live under ``work``, so the user's settings
    neither change the test nor get changed by it. On exit the server is asked to shut down
    (kernels included) through its API; whatever it started and is still alive is then ended.
    """
    port, token = free_port(), secrets.token_hex(16)
    lab = Lab(url=f"http://127.0.0.1:{port}/", token=token, log=work / "jupyter.log")
    env = os.environ | {
        "JUPYTER_CONFIG_DIR": str(work / "config"),
        "JUPYTER_RUNTIME_DIR": str(work / "runtime"),
        "IPYTHONDIR": str(work / "ipython"),
    }
    env.pop("JUPYTER_TOKEN", None)
    argv = [
        str(JUPYTER),
        "lab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--notebook-dir={notebook_dir}",
        f"--LabApp.user_settings_dir={write_settings(work / 'user-settings')}",
        f"--LabApp.workspaces_dir={work / 'workspaces'}",
    ]
    if os.geteuid() == 0:
        argv.append("--allow-root")  # CI and these machines run as root
    with lab.log.open("w") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    started: set[psutil.Process] = set()
    try:
        _wait_ready(proc, lab)
        yield lab
    finally:
        started = descendants(proc.pid)  # kernels run in their own session: note them now
        with contextlib.suppress(OSError, urllib.error.URLError):
            _request(lab.url + "api/shutdown", token, method="POST")
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        end(started | descendants(proc.pid))


def run_all_and_wait(page, until: str) -> None:
    """Run → Run All Cells on the open notebook, then wait for an output holding ``until``.

    The menu command does nothing until the page has its kernel, so it is retried until a
    prompt shows the cells started; an output with "Error" ends the wait at once.
    """
    import re

    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    started = page.locator(".jp-InputPrompt").filter(has_text=re.compile(r"\[(\*|\d+)\]"))
    for attempt in range(3):
        page.locator("#jp-MainMenu").get_by_text("Run", exact=True).click()
        page.locator(".lm-Menu").get_by_text("Run All Cells", exact=True).click()
        try:
            started.first.wait_for(timeout=10_000)
            break
        except PlaywrightTimeout:
            if attempt == 2:
                raise
    outputs = page.locator(".jp-OutputArea-output")
    outputs.filter(has_text=until).or_(outputs.filter(has_text="Error")).first.wait_for()
