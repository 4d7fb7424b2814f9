"""Tests for labkit.preflight.checks: Python, torch against the pin, torch.distributed, gloo."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.distributed as dist

from labkit.preflight import checks as env


def test_check_status_is_validated():
    with pytest.raises(ValueError, match="status"):
        env.Check("x", "bad", "detail")


@pytest.mark.parametrize(
    "version, status",
    [((3, 9, 18), "fail"), ((3, 10, 0), "ok"), ((3, 13, 5), "ok"), ((3, 14, 0), "fail")],
)
def test_python_version_range(version, status):
    check = env.check_python(version, "/opt/py/bin/python")
    assert check.status == status
    assert check.detail == f"{'.'.join(map(str, version))} at /opt/py/bin/python"
    assert bool(check.fix) == (status == "fail")


def test_python_reports_this_interpreter():
    check = env.check_python()
    assert sys.executable in check.detail
    assert check.status == "ok"  # the project requires 3.10–3.13, so this interpreter is one


def test_torch_pin_read_from_requirements(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("numpy==2.0\ntorch==2.99.1  # pinned\n")
    assert env.torch_pin(req) == ("2.99.1", "requirements.txt")
    req.write_text("numpy==2.0\n")
    assert env.torch_pin(req) == (env.FALLBACK_TORCH_PIN, "labkit's default")
    assert env.torch_pin(tmp_path / "missing.txt")[0] == "2.13.0"


def test_torch_pin_is_the_repository_pin():
    lines = env.REQUIREMENTS.read_text().splitlines()
    pinned = [line.split("==")[1].strip() for line in lines if line.startswith("torch==")]
    assert env.torch_pin() == (pinned[0], "requirements.txt")


def test_torch_version_match_and_mismatch():
    installed = torch.__version__.split("+")[0]
    assert env.check_torch((installed, "test")).status == "ok"
    check = env.check_torch(("0.0.1", "test"))
    assert check.status == "warn"
    assert "pip install torch==0.0.1" in check.fix
    assert torch.__version__ in check.detail


def test_distributed_and_gloo_fail_when_missing(monkeypatch):
    assert env.check_distributed().status == "ok"
    assert env.check_gloo().status == "ok"
    monkeypatch.setattr(dist, "is_gloo_available", lambda: False)
    assert env.check_gloo().status == "fail"
    monkeypatch.setattr(dist, "is_available", lambda: False)
    check = env.check_distributed()
    assert check.status == "fail" and check.fix
