"""The room test (tests/room/test_room.py) runs only when asked: ``pytest -m room``."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "room: N learners on one JupyterHub with a local spawner (several minutes on 2 cores; "
        "runs only with -m room, as `make room-test` does)",
    )
