"""Tests for labkit/profile/mfu.py: FLOPs counted per step, the dense estimate, MFU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import labkit as lk


def test_count_flops_of_a_matrix_product() -> None:
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert lk.profile.count_flops(lambda: a @ b) == 2 * 3 * 5 * 7
    assert lk.profile.count_flops(lambda: a.relu()) == 0  # element-wise ops count 0


@pytest.mark.parametrize("bias", [False, True])
def test_a_training_step_is_six_n_per_sample_less_the_first_input_gradient(bias: bool) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32, bias=bias), nn.ReLU(), nn.Linear(32, 4, bias=bias))
    x, batch = torch.randn(8, 16), 8
    got = lk.profile.count_flops(lambda: model(x).square().sum().backward())
    weights = 16 * 32 + 32 * 4  # biases: additions and sums, which count 0
    # forward 2N, backward 2N for weight gradients + 2N for input gradients, except that the
    # input x needs none: the first layer's 2·16·32 per sample is never computed
    assert got == lk.profile.dense_training_flops(weights, batch) - 2 * 16 * 32 * batch
    assert model[0].weight.grad is not None  # the step did run


def test_dense_estimate_and_mfu() -> None:
    assert lk.profile.dense_training_flops(1e9, 2048) == 6 * 1e9 * 2048
    assert lk.profile.mfu(6e12, 2.0, 6e12) == 0.5
    assert lk.profile.mfu(0, 1.0, 1.0) == 0.0
    for bad in [(1.0, 0.0, 1.0), (1.0, 1.0, 0.0), (-1.0, 1.0, 1.0)]:
        with pytest.raises(ValueError):
            lk.profile.mfu(*bad)
    with pytest.raises(ValueError):
        lk.profile.dense_training_flops(-1, 1)
