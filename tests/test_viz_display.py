"""Tests for labkit/viz/_display.py: returned Figures render as PNG in IPython, once."""

from __future__ import annotations

import base64

import pytest
from matplotlib.figure import Figure

from labkit.viz import collective_diagram
from labkit.viz._display import enable_inline_figures

InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell


@pytest.fixture
def shell():
    shell = InteractiveShell.instance()
    for formatter in shell.display_formatter.formatters.values():
        formatter.pop(Figure, None)
    yield shell
    for formatter in shell.display_formatter.formatters.values():
        formatter.pop(Figure, None)
    InteractiveShell.clear_instance()


def test_figure_gets_a_png_formatter(shell) -> None:
    fig = collective_diagram("all_reduce", [[0, 1], [10, 11]], [[10, 12], [10, 12]])
    data, _ = shell.display_formatter.format(fig)
    assert "image/png" not in data  # without labkit: text only
    assert enable_inline_figures(shell)
    data, _ = shell.display_formatter.format(fig)
    assert base64.b64decode(data["image/png"]).startswith(b"\x89PNG")


def test_an_existing_figure_formatter_is_kept(shell) -> None:
    def mine(fig):
        return "<svg/>"

    shell.display_formatter.formatters["image/svg+xml"].for_type(Figure, mine)
    assert enable_inline_figures(shell)
    data, _ = shell.display_formatter.format(Figure())
    assert data["image/svg+xml"] == "<svg/>" and "image/png" not in data


def test_outside_ipython_nothing_happens() -> None:
    assert enable_inline_figures(object()) is False
