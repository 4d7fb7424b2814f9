"""Tests for labkit/costmodel/fsdp.py: an FSDP step on one link, blocking or prefetched."""

from __future__ import annotations

import pytest

from labkit.costmodel import FsdpStepTime, fsdp_step_s


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_blocking_collectives_add_up_whatever_the_prefetch(n: int) -> None:
    f, b, a, r = 0.01, 0.02, 0.03, 0.05
    got = fsdp_step_s(n, f, b, a, r)
    assert got.forward_s == pytest.approx(n * (a + f))
    assert got.backward_s == pytest.approx(n * (a + b + r))
    assert got.total_s == pytest.approx(n * (2 * a + f + b + r))


def test_async_prefetch_when_compute_and_collectives_are_equal() -> None:
    # a = b = f = r = 1: forward a + (L-1)·a + f, backward a + (L-1)(b + r) + b + r
    got = fsdp_step_s(4, 1.0, 1.0, 1.0, 1.0, async_prefetch=True)
    assert got == FsdpStepTime(forward_s=5.0, backward_s=9.0)
    assert fsdp_step_s(4, 1.0, 1.0, 1.0, 1.0).total_s == 20.0  # blocking: 5 per unit


def test_async_prefetch_hides_all_gathers_under_longer_compute() -> None:
    f, b, a, r = 3.0, 4.0, 1.0, 0.5
    got = fsdp_step_s(3, f, b, a, r, async_prefetch=True)
    # only the first all-gather of each pass is exposed
    assert got.forward_s == pytest.approx(a + 3 * f)
    assert got.backward_s == pytest.approx(a + 3 * (b + r))


def test_a_slow_link_sets_the_pace_and_prefetch_never_hurts() -> None:
    f, b, a, r = 0.1, 0.1, 1.0, 1.0
    slow = fsdp_step_s(4, f, b, a, r, async_prefetch=True)
    assert slow.forward_s == pytest.approx(4 * a + f)  # all-gathers back to back
    for args in [(1, 1, 1, 1), (0.1, 3, 2, 0), (5, 0.2, 1, 2), (0, 0, 1, 1)]:
        for n in (1, 2, 5):
            fast = fsdp_step_s(n, *args, async_prefetch=True).total_s
            assert fast <= fsdp_step_s(n, *args).total_s + 1e-12
    # one unit: nothing to prefetch
    assert fsdp_step_s(1, f, b, a, r, async_prefetch=True) == fsdp_step_s(1, f, b, a, r)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="n_units"):
        fsdp_step_s(0, 1, 1, 1, 1)
    with pytest.raises(ValueError, match=">= 0"):
        fsdp_step_s(2, 1, -1, 1, 1)
