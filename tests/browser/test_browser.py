"""JupyterLab in a real browser: a widget renders and ``lk.launch`` streams rank output.

A learner's first minutes, end to end: JupyterLab on 127.0.0.1 with a random token, a small
notebook opened in headless Chromium (Debian's ``/usr/bin/chromium``, driven by Playwright),
Run → Run All Cells, then the DOM must hold a rendered ipywidgets slider and the launch
cell's ``[rank 0]`` / ``[rank 1]`` lines. Then, in the same server, a notebook under ``zh-CN/``
(notebook 05's exercise, its Chinese text from the catalogue, a wrong answer): the checker's
feedback must be Chinese, found from the notebook's folder alone. The screenshots land in
``test-artifacts/browser.png`` and ``browser-zh-CN.png`` (``LABKIT_TEST_ARTIFACTS`` moves them).

    .venv/bin/pytest -m browser tests/browser
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import nbformat
import pytest

from tests.browser.jupyter_lab import (
    JUPYTER,
    Lab,
    descendants,
    end,
    run_all_and_wait,
    running_lab,
    wait_for_kernel,
)

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("LABKIT_TEST_ARTIFACTS", ROOT / "test-artifacts"))
CHROMIUM = Path(os.environ.get("LABKIT_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 90_000  # kernel start, torch import and the launch itself, on a loaded machine
WORLD_SIZE = 2

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(300)]

SLIDER_CELL = """\
import ipywidgets as widgets

slider = widgets.IntSlider(value=2, min=1, max=4, description="world_size")
slider"""

LAUNCH_CELL = """\
import labkit as lk


def hello(rank, world_size):
    print(f"hello from rank {rank} of {world_size}")
    return rank


print("launch returned", lk.launch(hello, world_size=slider.value, timeout=60))"""


KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def write_notebook(folder: Path) -> str:
    """The notebook the browser runs: a slider, then a launch whose size the slider sets."""
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.cells = [
        nbformat.v4.new_markdown_cell("# Browser check"),
        nbformat.v4.new_code_cell(SLIDER_CELL),
        nbformat.v4.new_code_cell(LAUNCH_CELL),
    ]
    nbformat.write(nb, folder / "browser_check.ipynb")
    return "browser_check.ipynb"


ZH_CELL = """\
import labkit as lk


def my_ring_cost(n_bytes, world_size, alpha, beta, gamma):
    return 2 * (world_size - 1) * (alpha + n_bytes * beta)  # the whole tensor at every step


lk.exercises.check("05_ring_cost", my_ring_cost)"""


def write_chinese_notebook(folder: Path) -> str:
    """Notebook 05's exercise in Chinese (its catalogue's text) with a wrong answer, in zh-CN/."""
    from labkit.course import translate as tr

    english = ROOT / "notebooks" / "05_communication_cost.ipynb"
    catalogue = tr.load_catalogue(tr.catalogue_path(ROOT / "notebooks", "zh-CN", english))
    source = nbformat.read(english, as_version=4)
    exercise = next(c for c in source.cells if "Exercise: derive the ring" in c.source)
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.cells = [
        nbformat.v4.new_markdown_cell(catalogue["cells"][exercise.id]["text"]),
        nbformat.v4.new_code_cell(ZH_CELL),
    ]
    (folder / "zh-CN").mkdir()
    nbformat.write(nb, folder / "zh-CN" / "05_exercise.ipynb")
    return "zh-CN/05_exercise.ipynb"


def run_all_cells(page, lab: Lab, url: str, until: str) -> str:
    """Open the notebook, Run → Run All Cells, wait for an output holding ``until``; the text."""
    page.set_default_timeout(WAIT_MS)
    page.goto(url)
    page.locator(".jp-Notebook .jp-Cell").first.wait_for()
    wait_for_kernel(lab)
    run_all_and_wait(page, until)
    return page.locator(".jp-Notebook").inner_text()


def slider_label(page) -> str:
    slider = page.locator(".jp-OutputArea-output .jupyter-widgets.widget-slider")
    slider.wait_for()
    return slider.locator(".widget-label").inner_text()


def sync_playwright():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: pip install -r requirements-dev.txt")
    return sync_playwright


def test_widget_and_rank_output_render_in_jupyterlab(tmp_path):
    playwright = sync_playwright()
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: apt-get install chromium (.ci/run does)")
    if not JUPYTER.exists():
        pytest.skip(f"no JupyterLab at {JUPYTER}")
    (tmp_path / "notebooks").mkdir()
    name = write_notebook(tmp_path / "notebooks")
    zh_name = write_chinese_notebook(tmp_path / "notebooks")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot, zh_shot = ARTIFACTS / "browser.png", ARTIFACTS / "browser-zh-CN.png"
    for old in (shot, zh_shot, ARTIFACTS / "browser-failure.png"):
        old.unlink(missing_ok=True)
    before = descendants()
    try:
        with running_lab(tmp_path / "notebooks", tmp_path) as lab, playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS
            )
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            try:
                url = f"{lab.url}lab/tree/{{}}?token={lab.token}"
                text = run_all_cells(page, lab, url.format(name), "launch returned")
                label = slider_label(page)
                page.screenshot(path=str(shot), full_page=True)
                # A workspace of its own: only this notebook open, Run All runs it.
                zh_url = f"{lab.url}lab/workspaces/zh/tree/{zh_name}?token={lab.token}"
                zh_text = run_all_cells(page, lab, zh_url, "05_ring_cost")
                page.screenshot(path=str(zh_shot), full_page=True)
            except Exception:
                with contextlib.suppress(Exception):  # keep the first error, not this one
                    page.screenshot(path=str(ARTIFACTS / "browser-failure.png"), full_page=True)
                raise
            finally:
                browser.close()
    finally:
        end(descendants() - before)  # anything the server or the browser left behind
    assert label == "world_size", f"the slider shows the label {label!r}"
    for rank in range(WORLD_SIZE):
        assert f"[rank {rank}] hello from rank {rank} of {WORLD_SIZE}" in text, text
    assert f"launch returned {list(range(WORLD_SIZE))}" in text, text
    assert "Traceback" not in text and "Error" not in text, text
    assert shot.stat().st_size > 10_000, "the screenshot is empty"
    assert "练习" in zh_text and "✗ 05_ring_cost：" in zh_text, zh_text  # found by the folder
    assert "带宽项不对" in zh_text and "the bandwidth term" not in zh_text, zh_text
    assert zh_shot.stat().st_size > 10_000, "the Chinese screenshot is empty"
    assert not [p for p in descendants() - before if p.is_running()], "a process outlived it"
