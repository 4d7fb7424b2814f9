"""A learner in a real browser: log in on the hub's page, open a notebook in their JupyterLab,
Run All, see a widget and the ranks' output (headless Debian chromium, driven by Playwright).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import nbformat

from tests.browser.jupyter_lab import run_all_and_wait
from tests.browser.test_browser import CHROMIUM, CHROMIUM_FLAGS, LAUNCH_CELL, SLIDER_CELL
from tests.room.client import Learner

NOTEBOOK = "browser_check.ipynb"
SETTINGS = {  # no kernel dialog, no news toast: what the learner would click once
    "@jupyterlab/notebook-extension:tracker": {"autoStartDefaultKernel": True},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},
}


def available() -> str | None:
    """Why the browser cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed"
    return None if CHROMIUM.exists() else f"no Chromium at {CHROMIUM}"


def prepare(learner: Learner) -> None:
    """Put the check notebook and the lab settings into the learner's running server."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(SLIDER_CELL), nbformat.v4.new_code_cell(LAUNCH_CELL)]
    body = {"type": "notebook", "format": "json", "content": json.loads(nbformat.writes(nb))}
    code, raw = learner.server("PUT", f"api/contents/{NOTEBOOK}", body)
    assert code in (200, 201), f"{learner.name}: contents -> {code} {raw[:200]!r}"
    for plugin, values in SETTINGS.items():
        code, raw = learner.server("PUT", f"lab/api/settings/{plugin}", {"raw": json.dumps(values)})
        assert code in (200, 204), f"{learner.name}: settings {plugin} -> {code} {raw[:200]!r}"


def _kernel_ready(learner: Learner, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, raw = learner.server("GET", "api/kernels")
        if any(k["execution_state"] == "idle" and k["connections"] > 0 for k in json.loads(raw)):
            return
        time.sleep(0.5)
    raise TimeoutError(f"{learner.name}: no kernel ready in the browser after {timeout_s} s")


def browse(page, hub: str, learner: Learner, shot: Path, wait_s: float) -> str:
    """Log in with the form, open the notebook, Run All; the notebook's text."""

    page.set_default_timeout(wait_s * 1000)
    page.goto(hub + "hub/login")
    page.fill("#username_input", learner.name)
    page.fill("#password_input", learner.password)
    page.click("#login_submit")
    page.wait_for_url(re.compile(r"/(hub/home|hub/spawn|user/)"))
    page.goto(hub + f"user/{learner.name}/lab/tree/{NOTEBOOK}")
    page.locator(".jp-Notebook .jp-Cell").first.wait_for()
    _kernel_ready(learner, wait_s)
    run_all_and_wait(page, "launch returned")
    page.locator(".jp-OutputArea-output .jupyter-widgets.widget-slider").wait_for()
    page.screenshot(path=str(shot), full_page=True)
    return page.locator(".jp-Notebook").inner_text()


def browse_all(hub: str, learners: list[Learner], artifacts: Path, wait_s: float) -> dict:
    """Each learner in their own browser context (own cookies); name -> notebook text."""
    from playwright.sync_api import sync_playwright

    artifacts.mkdir(parents=True, exist_ok=True)
    texts = {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
        )
        try:
            for learner in learners:
                prepare(learner)
                context = browser.new_context(viewport={"width": 1280, "height": 900})
                page = context.new_page()
                shot = artifacts / f"room-{learner.name}.png"
                try:
                    texts[learner.name] = browse(page, hub, learner, shot, wait_s)
                except Exception:
                    page.screenshot(path=str(artifacts / f"room-{learner.name}-failure.png"))
                    raise
                finally:
                    context.close()
        finally:
            browser.close()
    return texts
