"""lk.profile.matmul_flops counts what torch's FlopCounterMode counts for matrix products."""

from __future__ import annotations

import pytest
import torch

import labkit as lk


def _products(a, b, c):
    return [a @ b, torch.matmul(a, b), a.matmul(b), c[0].mm(c[1]), torch.bmm(a[0], b[0])]


def test_counts_as_flop_counter_mode():
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(2, 3, 5, 4, generator=g), torch.randn(2, 3, 4, 6, generator=g)
    c = torch.randn(2, 7, 7, generator=g)
    with lk.profile.matmul_flops() as ours:
        _products(a, b, c)
    with FlopCounterMode(display=False) as theirs:
        _products(a, b, c)
    assert ours.total == theirs.get_total_flops() > 0
    assert ours.calls == {"matmul": 3, "mm": 1, "bmm": 1}  # `@` arrives as matmul
    one = 2 * 2 * 3 * 5 * 6 * 4  # 2 · batch · m · n · k
    with lk.profile.matmul_flops() as just_one:
        torch.nn.functional.relu(a) @ b  # other functions pass through uncounted
    assert just_one.total == one
    with lk.profile.matmul_flops() as vectors:  # FlopCounterMode leaves these two out
        a[0, 0, 0] @ b[0, 0, :, 0]  # a dot product of 4 terms
        a[0, 0] @ b[0, 0, :, 0]  # a (5, 4) matrix times a vector
    assert vectors.total == 2 * 4 + 2 * 5 * 4


def test_nothing_outside_the_block():
    with lk.profile.matmul_flops() as flops:
        pass
    torch.ones(2, 2) @ torch.ones(2, 2)
    assert flops.total == 0 and flops.calls == {}


@pytest.mark.parametrize("n", [8, 16])
def test_attention_scores_are_quadratic(n):
    q = torch.randn(1, 2, n, 4)
    with lk.profile.matmul_flops() as flops:
        lk.parallel.context.softmax_attention(q, q, q)
    assert flops.total == 2 * (2 * 2 * n * n * 4)  # QKᵀ and PV
