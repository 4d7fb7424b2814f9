"""Tests for labkit/bench_compute.py: the matrix-product rate MFU divides by."""

from __future__ import annotations

import itertools

import pytest
import torch

import labkit as lk


def test_rate_is_two_n_cubed_over_the_median_product() -> None:
    ticks = itertools.count(step=0.25)  # start, end, start, ...: every product takes 0.25 s
    got = lk.bench.peak_flops(n=8, repeats=3, warmup=1, clock=lambda: next(ticks))
    assert got.seconds == 0.25 and got.times_s == (0.25, 0.25, 0.25)
    assert got.flops_per_s == 2 * 8**3 / 0.25 and got.gflops == got.flops_per_s / 1e9
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
