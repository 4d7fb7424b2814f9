"""Tests for labkit/optim.py: scaling rules, gradual warmup, and decay checked against torch."""

from __future__ import annotations

import math

import pytest
import torch

from labkit.optim import (
    linear_scaling_warmup,
    lr_factor,
    scaled_lr,
    sqrt_scaled_adam,
    torch_warmup_decay,
)


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


def test_sqrt_rule_for_adam() -> None:
    # Malladi et al. 2022: batch × κ → lr × √κ, 1 − β × κ, ε ÷ √κ.
    assert scaled_lr(1e-3, 1024, 256, rule="sqrt") == pytest.approx(2e-3)
    assert scaled_lr(1e-3, 256, 256, rule="sqrt") == pytest.approx(1e-3)
    hp = sqrt_scaled_adam(1e-3, (0.9, 0.999), 1e-8, 1024, 256)
    assert hp["lr"] == pytest.approx(2e-3)
    assert hp["betas"] == pytest.approx((0.6, 0.996))
    assert hp["eps"] == pytest.approx(5e-9)
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], **hp)  # valid Adam arguments
    with pytest.raises(ValueError, match="too large for betas"):
        sqrt_scaled_adam(1e-3, (0.9, 0.999), 1e-8, 256 * 11, 256)  # β₁ → 1 − 11 · 0.1 < 0
    with pytest.raises(ValueError, match="rule must be one of"):
        scaled_lr(1e-3, 512, 256, rule="cube")


def test_sqrt_rule_warmup_reaches_root_k() -> None:
    opt = _optimizer(0.01)
    sched = linear_scaling_warmup(opt, 1024, 256, warmup_steps=4, rule="sqrt")
    assert _lrs(sched, opt, 6) == pytest.approx([0.01, 0.0125, 0.015, 0.0175, 0.02, 0.02])


@pytest.mark.parametrize("decay", ["linear", "cosine"])
@pytest.mark.parametrize(
    ("warmup", "total", "final"), [(6, 48, 0.0), (5, 30, 0.1), (0, 20, 0.1), (1, 2, 0.0)]
)
def test_decay_equals_torch_schedulers_at_every_step(decay, warmup, total, final) -> None:
    base, k = 0.03, 8
    ours = _optimizer(base)
    sched = linear_scaling_warmup(
        ours, 32 * k, 32, warmup, decay=decay, total_steps=total, final_fraction=final
    )
    theirs = _optimizer(base * k)  # torch's factors are <= 1: built at the peak rate
    ref = torch_warmup_decay(theirs, k, warmup, total, decay, final)
    got, want = _lrs(sched, ours, total + 1), _lrs(ref, theirs, total + 1)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert got[0] == pytest.approx(base if warmup else base * k)
    assert got[warmup] == pytest.approx(base * k)  # the peak, right after the warmup
    assert got[total] == pytest.approx(final * base * k, abs=1e-15)


def test_decay_known_values_and_after_the_end() -> None:
    # k = 4, warmup 2, decay over steps 2..6: cosine at the midpoint is (peak + final) / 2.
    assert lr_factor(4, 4.0, 2, decay="cosine", total_steps=6) == pytest.approx(2.0)
    assert lr_factor(4, 4.0, 2, decay="linear", total_steps=6) == pytest.approx(2.0)
    assert lr_factor(3, 4.0, 2, decay="cosine", total_steps=6) == pytest.approx(
        4.0 * (1 + math.cos(math.pi / 4)) / 2
    )
    assert lr_factor(3, 4.0, 2, decay="linear", total_steps=6) == pytest.approx(3.0)
    for decay in ("linear", "cosine"):  # after total_steps: stays at the final rate
        got = lr_factor(99, 4.0, 2, decay=decay, total_steps=6, final_fraction=0.1)
        assert got == pytest.approx(0.4)


def test_decay_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="needs total_steps > warmup_steps"):
        lr_factor(0, 4.0, 5, decay="cosine")
    with pytest.raises(ValueError, match="needs total_steps > warmup_steps"):
        linear_scaling_warmup(_optimizer(), 512, 256, 5, decay="linear", total_steps=5)
    with pytest.raises(ValueError, match="decay must be one of"):
        lr_factor(0, 4.0, 5, decay="exp", total_steps=9)
    with pytest.raises(ValueError, match="final_fraction"):
        lr_factor(0, 4.0, 5, decay="linear", total_steps=9, final_fraction=1.5)
    with pytest.raises(ValueError, match="need scale >= 1"):
        torch_warmup_decay(_optimizer(), 0.5, 2, 9, "cosine")
