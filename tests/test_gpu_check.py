"""`make gpu-check` (.ci/gpu-check): parses, and on a machine without a usable GPU says so."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "gpu-check"


def test_the_script_parses_and_is_executable():
    assert SCRIPT.stat().st_mode & 0o111
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", str(SCRIPT)], check=True)
    makefile = (ROOT / "Makefile").read_text()
    assert "gpu-check:\n\tbash .ci/gpu-check" in makefile


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_exits_2_and_says_why(tmp_path):
    done = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env={**os.environ, "GPU_CHECK_OUT": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "torch sees no GPU here" in done.stderr
    assert "cuda available False" in (tmp_path / "torch.txt").read_text()
    assert "labkit doctor:" in done.stderr  # the doctor's table explains it
