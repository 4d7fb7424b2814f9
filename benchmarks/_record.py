"""What every benchmark script writes the same way: the machine line and the published report.

The scripts run as ``python benchmarks/NAME.py``, so this folder is on their path.
"""

from __future__ import annotations

import os
import platform
import time

import torch


def machine() -> str:
    """``2026-12-05, x86_64, 2 CPU cores, torch 2.13.0+cpu``: the start of a results section."""
    return (
        f"{time.strftime('%Y-%m-%d')}, {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"torch {torch.__version__}"
    )


def publish(text: str, out: str | None) -> None:
    """Print a markdown section and, with ``--out FILE``, append it to that file."""
    print(text)
    if out:
        with open(out, "a") as f:
            f.write("\n" + text)
