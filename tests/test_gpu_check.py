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


def test_the_steps_fit_the_ten_minute_budget():
    """Every limit the script sets, each plus its SIGKILL grace, sums to under 10 minutes; the
    header states the same numbers."""
    import re

    text = SCRIPT.read_text()
    kill_after = int(re.search(r"^KILL_AFTER=(\d+)$", text, re.M)[1])
    deadline = int(re.search(r"^DEADLINE=(\d+)$", text, re.M)[1])
    steps = dict(re.findall(r"^\s*step ([\w-]+) (\d+) ", text, re.M))  # set-up: one of two
    limits = [int(s) for s in steps.values()]
    limits += [int(s) for s in re.findall(r'"\$\(limit (\d+)\)" (?:nvidia-smi|"\$py")', text)]
    assert len(limits) == 7  # set-up, nvidia-smi, torch probe, doctor, GPU tests, course, summary
    total = sum(limits) + kill_after * len(limits)
    assert total <= deadline < 600, (limits, total)
    assert f"= {sum(limits)}," in text and f"): {total}." in text  # the header's arithmetic
    assert "--kill-after 20" not in text and text.count("timeout ") == text.count("--kill-after")
