"""Tests for labkit/precision.py: bf16 autocast and fp16 + GradScaler, on the CPU (and GPU)."""

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


def test_fp16_with_grad_scaler_trains_on_cpu(digits) -> None:
    assert precision.unsupported_reason("fp16", "cpu") is None
    scaler = precision.make_scaler("fp16", "cpu")
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 2.0**16
    model, x = lk.models.MLP(seed=0), torch.randn(4, 64)
    with precision.autocast("fp16", "cpu"):
        assert model(x).dtype == torch.float16  # CPU autocast runs the linear layers in fp16
    fp32, fp16 = _train("fp32", digits), _train("fp16", digits)
    assert abs(fp16["accuracy"] - fp32["accuracy"]) <= ACCURACY_TOL
    assert fp16["losses"] != fp32["losses"]  # fp16 really changed the arithmetic
    # 5 epochs of 23 steps: fewer than growth_interval (2000) clean steps, and none overflowed.
    assert fp16["scale"] == 2.0**16


def test_fp16_autocast_runs_every_course_model_on_cpu() -> None:
    cases = [
        (lk.models.MLP(seed=0), torch.randn(4, 64)),
        (lk.models.CNN(seed=0), torch.randn(4, 1, 8, 8)),
        (lk.models.TinyGPT(16, seq_len=8, seed=0), torch.randint(0, 16, (2, 8))),
    ]
    for model, x in cases:
        with precision.autocast("fp16", "cpu"):
            out = model(x)
        assert out.dtype == torch.float16, type(model).__name__
        out.float().sum().backward()
        for p in model.parameters():  # fp32 master weights get fp32, finite gradients
            assert p.grad is not None and p.grad.dtype == torch.float32
            assert torch.isfinite(p.grad).all()


def _flat(model: nn.Module) -> torch.Tensor:
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def test_grad_scaler_on_cpu_backs_off_skips_and_grows_by_the_rule() -> None:
    # S = 2^24 makes fp16's backward overflow (the loss gradient 1/32 times S > 65504): the
    # scaler halves S and skips the step until the gradients fit, then doubles S every
    # growth_interval clean steps — the rule next_loss_scale writes out.
    model = lk.models.MLP(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = precision.make_scaler("fp16", "cpu", init_scale=2.0**24, growth_interval=4)
    x_all, y_all = lk.data.digits("train").tensors
    scale, clean, seen = 2.0**24, 0, {"skip": 0, "grow": 0}
    for s in range(16):
        x, y = x_all[32 * s : 32 * (s + 1)], y_all[32 * s : 32 * (s + 1)]
        before = _flat(model)
        precision.mixed_precision_step(model, opt, x, y, nn.functional.cross_entropy, "fp16",
                                       scaler)  # fmt: skip
        found_inf = not all(torch.isfinite(p.grad).all() for p in model.parameters())
        assert torch.equal(_flat(model), before) == found_inf  # skipped exactly on overflow
        new_scale, clean = precision.next_loss_scale(scale, clean, found_inf, growth_interval=4)
        assert scaler.get_scale() == new_scale, s
        seen["skip"] += found_inf
        seen["grow"] += new_scale > scale
        scale = new_scale
    assert seen["skip"] >= 2 and seen["grow"] >= 1  # both branches ran


def test_grad_scaler_skips_a_nan_gradient_on_cpu() -> None:
    model = lk.models.MLP(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = precision.make_scaler("fp16", "cpu")
    x, y = torch.randn(8, 64), torch.randint(0, 10, (8,))
    x[3, 5] = float("nan")  # one corrupted sample: NaN loss, NaN gradients
    before = _flat(model)
    precision.mixed_precision_step(model, opt, x, y, nn.functional.cross_entropy, "fp16", scaler)
    assert torch.equal(_flat(model), before)
    assert scaler.get_scale() == 2.0**15


def test_next_loss_scale_known_values() -> None:
    assert precision.next_loss_scale(1024.0, 7, True) == (512.0, 0)
    assert precision.next_loss_scale(1024.0, 0, False, growth_interval=3) == (1024.0, 1)
    assert precision.next_loss_scale(1024.0, 2, False, growth_interval=3) == (2048.0, 0)
    assert precision.next_loss_scale(8.0, 0, False, 4.0, 0.25, growth_interval=1) == (32.0, 0)


def test_precisions_and_scalers_are_checked() -> None:
    assert precision.unsupported_reason("bf16", "cpu") is None
    assert precision.unsupported_reason("fp32", "cpu") is None
    assert precision.make_scaler("bf16", "cpu") is None
    if not torch.cuda.is_available():
        assert "is_available() is False" in precision.unsupported_reason("fp16", "cuda")
        with pytest.raises(RuntimeError, match="is_available"):
            precision.make_scaler("fp16", "cuda")
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
