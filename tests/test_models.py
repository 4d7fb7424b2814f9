"""Tests for labkit/models.py: shapes, seeding and the size-dialled MLP."""

from __future__ import annotations

import pytest
import torch

from labkit import models


def test_same_seed_same_parameters_without_touching_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = models.MLP(seed=7), models.CNN(seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)  # building models did not consume the global RNG
    for m, twin in ((a, models.MLP(seed=7)), (b, models.CNN(seed=7))):
        for p, q in zip(m.parameters(), twin.parameters(), strict=True):
            assert torch.equal(p, q)
    assert not torch.equal(models.MLP(seed=8).net[0].weight, a.net[0].weight)


def test_shapes_flat_and_image_inputs():
    x = torch.rand(5, 64)
    assert models.MLP()(x).shape == (5, 10)
    assert models.CNN()(x).shape == (5, 10)
    assert models.CNN()(x.view(5, 1, 8, 8)).shape == (5, 10)
    assert models.MLP(in_features=3, hidden=(), out_features=2)(torch.rand(4, 3)).shape == (4, 2)


@pytest.mark.parametrize("n", [1, 10_000, 5_000_000])
def test_mlp_with_parameters_is_smallest_multiple_of_64(n):
    m = models.mlp_with_parameters(n, n_layers=3)
    size = models.count_parameters(m)
    assert size >= n
    h = m.net[0].out_features
    if h > 64:
        smaller = models.MLP(64, (h - 64,) * 3, 10)
        assert models.count_parameters(smaller) < n


def test_mlp_with_parameters_rejects_bad_input():
    with pytest.raises(ValueError, match="n_params"):
        models.mlp_with_parameters(0)


def test_compute_delay_is_an_identity_that_takes_time():
    import time

    layer = models.ComputeDelay(forward_ms=5, backward_ms=15)
    x = torch.randn(3, 4, requires_grad=True)
    start = time.perf_counter()
    y = layer(x)
    forward_s = time.perf_counter() - start
    assert torch.equal(y, x) and forward_s >= 5e-3
    start = time.perf_counter()
    (y * torch.arange(4.0)).sum().backward()
    assert time.perf_counter() - start >= 15e-3
    assert torch.equal(x.grad, torch.arange(4.0).expand(3, 4))
    assert "backward_ms=15" in repr(layer)
    with pytest.raises(ValueError, match=">= 0 ms"):
        models.ComputeDelay(backward_ms=-1)
