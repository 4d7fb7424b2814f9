"""LABKIT_TIMEOUT_SCALE: every labkit deadline stretches on a loaded box (a workshop room)."""

from __future__ import annotations

import pytest

import labkit as lk
from labkit.launcher._checks import make_plan
from labkit.launcher.stretch import timeout_scale


@pytest.mark.parametrize(
    "value, scale",
    [(None, 1.0), ("", 1.0), ("4", 4.0), ("2.5", 2.5), ("0.5", 1.0), ("inf", 1.0), ("-3", 1.0)],
)
def test_the_scale_comes_from_the_environment_and_never_shortens(monkeypatch, value, scale):
    if value is None:
        monkeypatch.delenv("LABKIT_TIMEOUT_SCALE", raising=False)
    else:
        monkeypatch.setenv("LABKIT_TIMEOUT_SCALE", value)
    assert timeout_scale() == scale
    assert lk.stretch(30) == 30 * scale


def test_a_wrong_value_says_what_to_write(monkeypatch):
    monkeypatch.setenv("LABKIT_TIMEOUT_SCALE", "lots")
    with pytest.raises(ValueError, match="LABKIT_TIMEOUT_SCALE='lots': give a number"):
        lk.stretch(1)


def test_a_launch_plan_stretches_both_deadlines(monkeypatch):
    monkeypatch.delenv("LABKIT_TIMEOUT_SCALE", raising=False)
    alone = make_plan(2, "gloo", "cpu", 10, False)
    monkeypatch.setenv("LABKIT_TIMEOUT_SCALE", "3")
    loaded = make_plan(2, "gloo", "cpu", 10, False)
    assert (alone.timeout, alone.pg_timeout) == (10.0, 70.0)
    assert (loaded.timeout, loaded.pg_timeout) == (30.0, 210.0)


def test_a_stretched_launch_still_times_out_and_says_when(monkeypatch):
    monkeypatch.setenv("LABKIT_TIMEOUT_SCALE", "2")

    def stuck(rank, world_size):
        import time

        time.sleep(60)

    with pytest.raises(lk.LaunchTimeout, match=r"no result within timeout=2 s"):
        lk.launch(stuck, 2, backend="gloo", device="cpu", timeout=1)
