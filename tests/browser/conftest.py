"""Real-browser tests: JupyterLab in headless Chromium (see test_browser.py)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "browser: drives JupyterLab in headless Chromium (playwright + Debian's chromium); "
        "skips itself when either is missing",
    )
