"""Tests for labkit/bench_compute.py: the matrix-product rate MFU divides by."""

from __future__ import annotations

import pytest
import torch

import labkit as lk


def test_peak_is_two_n_cubed_over_the_fastest_product() -> None:
    # clock readings: the warm-up's start, then start, end per product: 0.25, 0.25, 1.0 s
    ticks = iter([0.0, 1.0, 1.25, 2.0, 2.25, 3.0, 4.0])
    got = lk.bench.peak_flops(n=8, repeats=3, warmup=1, clock=lambda: next(ticks))
    assert got.times_s == (0.25, 0.25, 1.0) and got.seconds == 0.25  # warm-up dropped
    assert got.flops_per_s == 2 * 8**3 / 0.25 and got.gflops == got.flops_per_s / 1e9
    assert got.median_flops_per_s == got.flops_per_s  # the median product took 0.25 s too
    assert (got.n, got.dtype, got.device) == (8, "float32", "cpu")


def test_threads_are_set_for_the_measurement_and_restored() -> None:
    before = torch.get_num_threads()
    got = lk.bench.peak_flops(n=32, threads=1, repeats=2)
    assert got.threads == 1 and torch.get_num_threads() == before
    assert got.flops_per_s > 0 and len(got.times_s) == 2
    assert lk.bench.peak_flops(n=16, repeats=1).threads == before


def test_other_dtypes() -> None:
    got = lk.bench.peak_flops(n=16, dtype=torch.bfloat16, repeats=2, warmup=0)
    assert got.dtype == "bfloat16" and got.flops_per_s > 0


@pytest.mark.parametrize("kwargs", [{"n": 0}, {"repeats": 0}, {"warmup": -1}, {"threads": 0}])
def test_bad_arguments_are_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        lk.bench.peak_flops(**kwargs)
