"""Tests for labkit/optim.py: the linear scaling rule with gradual warmup (Goyal et al. 2017)."""

from __future__ import annotations

import pytest
import torch

from labkit.optim import linear_scaling_warmup, lr_factor, scaled_lr


def _optimizer(lr: float = 0.1, groups: int = 1) -> torch.optim.SGD:
    params = [
        {"params": [torch.nn.Parameter(torch.zeros(1))], "lr": lr * (g + 1)} for g in range(groups)
    ]
    return torch.optim.SGD(params, lr=lr)


def _lrs(scheduler, optimizer, steps: int, group: int = 0) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[group]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_scaled_lr_is_linear_in_the_global_batch() -> None:
    # The paper's reference point: lr 0.1 for batch 256; batch 8192 (k = 32) → 3.2.
    assert scaled_lr(0.1, 8192, 256) == pytest.approx(3.2)
    assert scaled_lr(0.1, 256, 256) == pytest.approx(0.1)
    assert scaled_lr(0.1, 128, 256) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="batches > 0"):
        scaled_lr(0.1, 0, 256)


def test_warmup_values_at_known_steps() -> None:
    # k = 4, 10 warmup steps: 1 + 3·t/10 → 1.0, 1.3, ..., 3.7, then 4.
    opt = _optimizer(0.1)
    sched = linear_scaling_warmup(opt, global_batch=1024, base_batch=256, warmup_steps=10)
    assert isinstance(sched, torch.optim.lr_scheduler.LRScheduler)
    lrs = _lrs(sched, opt, 14)
    want = [0.1 * (1 + 3 * t / 10) for t in range(10)] + [0.4] * 4
    assert lrs == pytest.approx(want, rel=1e-12)
    assert lrs[0] == pytest.approx(0.1) and lrs[5] == pytest.approx(0.25)
    assert lrs[10] == pytest.approx(scaled_lr(0.1, 1024, 256))


def test_milestones_divide_after_warmup() -> None:
    opt = _optimizer(0.1)
    sched = linear_scaling_warmup(opt, 512, 256, warmup_steps=2, milestones=(4, 6), gamma=0.1)
    assert _lrs(sched, opt, 8) == pytest.approx(
        [0.1, 0.15, 0.2, 0.2, 0.02, 0.02, 0.002, 0.002], rel=1e-12
    )


def test_no_warmup_starts_at_the_scaled_rate_and_groups_keep_their_ratio() -> None:
    opt = _optimizer(0.1, groups=2)
    sched = linear_scaling_warmup(opt, 2048, 256, warmup_steps=0)
    assert _lrs(sched, opt, 2, group=0) == pytest.approx([0.8, 0.8])
    assert opt.param_groups[1]["lr"] == pytest.approx(1.6)  # base 0.2, k = 8


def test_lr_factor_is_continuous_at_the_end_of_warmup() -> None:
    for scale in (0.5, 1.0, 4.0, 32.0):
        w = 50
        assert lr_factor(0, scale, w) == 1.0
        assert lr_factor(w, scale, w) == scale
        assert abs(lr_factor(w - 1, scale, w) - scale) == pytest.approx(abs(scale - 1) / w)
    with pytest.raises(ValueError):
        lr_factor(-1, 4.0, 10)
    with pytest.raises(ValueError, match="warmup_steps must be"):
        linear_scaling_warmup(_optimizer(), 512, 256, warmup_steps=-1)
