"""Tests for labkit/precision.py: bf16 autocast on CPU, fp16 + GradScaler on GPU only."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import labkit as lk
from labkit import precision

EPOCHS = 5
# 359 test digits: 0.02 is 7 images. Over 4 seeds × (3, 10) epochs bf16 and fp32 differed by at
# most 2 images, while fp32 alone moved by 5 images between seeds at 10 epochs: 7 is above the
# rounding effect and below a real loss of accuracy (a broken cast costs far more).
ACCURACY_TOL = 0.02
LOSS_RTOL = 0.05  # mean of the last 20 step losses


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models in this process: one thread is faster than two on a shared 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def digits():
    return lk.data.digits("train"), lk.data.digits("test")


def _train(prec: str, digits, device: str = "cpu") -> dict:
    model = lk.models.MLP(seed=0).to(device)
    return precision.train_classifier(model, *digits, precision=prec, epochs=EPOCHS, lr=0.05)


def test_bf16_autocast_runs_the_linear_layers_in_bf16_on_cpu() -> None:
    model, x = lk.models.MLP(seed=0), torch.randn(4, 64)
    with precision.autocast("bf16", "cpu"):
        assert model(x).dtype == torch.bfloat16
    with precision.autocast("fp32", "cpu"):
        assert model(x).dtype == torch.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights


def test_bf16_training_reaches_fp32_accuracy(digits) -> None:
    fp32, bf16 = _train("fp32", digits), _train("bf16", digits)
    assert fp32["accuracy"] > 0.85 and bf16["accuracy"] > 0.85
    assert abs(bf16["accuracy"] - fp32["accuracy"]) <= ACCURACY_TOL
    tail32, tail16 = (sum(r["losses"][-20:]) / 20 for r in (fp32, bf16))
    assert tail16 == pytest.approx(tail32, rel=LOSS_RTOL)
    assert fp32["losses"] != bf16["losses"]  # bf16 really changed the arithmetic
    assert bf16["scale"] is None


def test_fp32_step_equals_a_plain_step() -> None:
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    a, b = lk.models.MLP(seed=0), lk.models.MLP(seed=0)
    opt_a, opt_b = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (a, b))
    loss = precision.mixed_precision_step(a, opt_a, x, y, nn.functional.cross_entropy, "fp32")
    ref = nn.functional.cross_entropy(b(x), y)
    ref.backward()
    opt_b.step()
    assert loss == ref.item()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_clipping_in_the_step_bounds_the_update() -> None:
    x, y = torch.randn(16, 64), torch.randint(0, 10, (16,))
    model = lk.models.MLP(seed=0)
    before = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    precision.mixed_precision_step(
        model, opt, x, y, nn.functional.cross_entropy, "bf16", max_norm=1e-3
    )
    step = nn.utils.parameters_to_vector(model.parameters()).detach() - before
    assert step.norm().item() == pytest.approx(1e-3, rel=1e-3)


def test_fp16_is_refused_on_cpu_with_the_reason() -> None:
    reason = precision.unsupported_reason("fp16", "cpu")
    assert reason is not None and "GradScaler" in reason and "bf16" in reason
    assert precision.unsupported_reason("bf16", "cpu") is None
    assert precision.unsupported_reason("fp32", "cpu") is None
    with pytest.raises(RuntimeError, match="CUDA path"):
        precision.make_scaler("fp16", "cpu")
    model = lk.models.MLP(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(2, 64), torch.zeros(2, dtype=torch.long)
    with pytest.raises(ValueError, match="fp16 needs a GradScaler"):
        precision.mixed_precision_step(model, opt, x, y, nn.functional.cross_entropy, "fp16")
    with pytest.raises(ValueError, match="precision must be one of"):
        precision.unsupported_reason("fp8", "cpu")


@pytest.mark.gpu
def test_fp16_with_grad_scaler_on_gpu(digits) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    fp32, fp16 = _train("fp32", digits, "cuda"), _train("fp16", digits, "cuda")
    assert abs(fp16["accuracy"] - fp32["accuracy"]) <= ACCURACY_TOL
    assert fp16["scale"] is not None and 0 < fp16["scale"] < float("inf")


@pytest.mark.gpu
def test_grad_scaler_skips_a_step_that_overflows_fp16() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = lk.models.MLP(seed=0).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", init_scale=2.0**40)  # S·grad overflows 65504
    before = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    x, y = torch.randn(32, 64, device="cuda"), torch.randint(0, 10, (32,), device="cuda")
    precision.mixed_precision_step(model, opt, x, y, nn.functional.cross_entropy, "fp16", scaler)
    assert torch.equal(nn.utils.parameters_to_vector(model.parameters()), before)  # skipped
    assert scaler.get_scale() == 2.0**39  # backoff factor 0.5
