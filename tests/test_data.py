"""Tests for labkit/data.py: the shipped digits and synthetic regression data."""

from __future__ import annotations

import pytest
import torch

from labkit import data


def test_digits_split_is_a_fixed_partition():
    train, test, full = data.digits("train"), data.digits("test"), data.digits("all")
    assert len(train) + len(test) == len(full) == 1797
    x, y = train.tensors
    assert x.dtype == torch.float32 and x.shape[1] == 64 and 0.0 <= x.min() and x.max() <= 1.0
    assert y.dtype == torch.int64 and set(y.tolist()) == set(range(10))
    again = data.digits("train")
    assert torch.equal(again.tensors[0], x)
    rows = {tuple(r.tolist()) + (int(c),) for r, c in zip(*full.tensors, strict=True)}
    assert all(tuple(r.tolist()) + (int(c),) in rows for r, c in zip(*test.tensors, strict=True))


def test_digits_images_and_errors():
    assert data.digits("test", images=True).tensors[0].shape[1:] == (1, 8, 8)
    with pytest.raises(ValueError, match="split"):
        data.digits("valid")
    with pytest.raises(ValueError, match="test_fraction"):
        data.digits(test_fraction=1.0)


def test_synthetic_regression_recovers_true_weights():
    ds, w, b = data.synthetic_regression(512, 4, 2, noise=0.0, seed=3)
    x, y = ds.tensors
    sol = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1)], 1), y).solution
    torch.testing.assert_close(sol[:4].T, w, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sol[4], b, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        data.synthetic_regression(0)


def test_shard_loader_needs_a_process_group():
    # In a rank it is exercised by tests/test_parallel_ddp.py (every shard, padding, drop_last).
    with pytest.raises(ValueError, match="initialised process group"):
        data.shard_loader(data.digits("test"), 4)
