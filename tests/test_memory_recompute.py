"""Activation recomputation: the model of what a block keeps and recomputes, against torch.

- arithmetic: ``block_activation_terms(recompute=...)`` sums to Korthikanti et al.'s closed forms
  (sbh(34 + 5as/h), sbh·34, 2sbh) for every tensor-parallel layout, and ``block_flops`` to the
  forward 24sbh² + 4bs²h;
- measured on ``labkit.models.TransformerBlock`` (one process): the bytes autograd keeps under
  ``apply_ac`` none / selective / full, with the flash and the math attention, equal the model
  to the byte; the gradients equal the unchecked block's bit for bit; and the products
  ``FlopCounterMode`` counts equal ``block_flops``, early stop or not.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import set_checkpoint_early_stop
from torch.utils.flop_counter import FlopCounterMode

import labkit as lk
from labkit import memory
from labkit.models import TransformerBlock
from labkit.parallel.compose import apply_ac

MODES = memory.RECOMPUTE_MODES
SHAPES = [(2, 8, 16, 4, 64), (3, 5, 12, 3, 20)]  # (B, T, h, heads, MLP width): B ≠ T
KERNELS = {"flash": None, "softmax": SDPBackend.MATH}  # what sdpa runs → the model's attention


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models in this process: one thread is faster than two on a shared 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _labkit(f: int, attention: str) -> dict:
    """labkit's block as it runs here: fp32, no dropout, fp32 LayerNorm statistics."""
    return {"ffn_hidden": f, "bytes_per_element": 4, "attention": attention, "dropout": False,
            "layernorm_stat_bytes": 4}  # fmt: skip


# --- arithmetic ------------------------------------------------------------------------------


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("seq_par", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_terms_sum_to_korthikanti_under_recompute(t: int, seq_par: bool, mode: str) -> None:
    s, b, h, a = 2048, 1, 12288, 96  # GPT-3 175B (Korthikanti et al. 2022, Table 3)
    kw = {"tensor_parallel": t, "sequence_parallel": seq_par, "recompute": mode}
    want = memory.activation_bytes_per_layer(s, b, h, a, **kw)
    assert memory.block_activation_bytes(s, b, h, a, **kw) == pytest.approx(want, rel=1e-12)
    sbh = s * b * h
    closed = {
        "none": sbh * ((34 / t if seq_par else 10 + 24 / t) + 5 * a * s / (h * t)),
        "selective": sbh * (34 / t if seq_par else 10 + 24 / t),
        "full": 2 * sbh / (t if seq_par else 1),
    }
    assert want == pytest.approx(closed[mode], rel=1e-12)


def test_selective_drops_the_attention_core_and_full_keeps_the_input() -> None:
    for attention in memory.ATTENTION_KINDS:
        kw = {"attention": attention, "layernorm_stat_bytes": 4}
        none = memory.block_activation_terms(8, 2, 16, 4, **kw)
        sel = memory.block_activation_terms(8, 2, 16, 4, recompute="selective", **kw)
        full = memory.block_activation_terms(8, 2, 16, 4, recompute="full", **kw)
        assert set(none) - set(sel) == set(none) & set(memory.ATTENTION_CORE_TERMS) != set()
        assert all(sel[k] == none[k] for k in sel)  # nothing else changes
        assert full == {"ln1 input": none["ln1 input"]} == {"ln1 input": 2 * 8 * 2 * 16}
    # GPT-3: the core is 5as/h = 80 of 114 sbh: selective keeps 30 %
    ratio = memory.activation_bytes_per_layer(2048, 1, 12288, 96, recompute="selective") / (
        memory.activation_bytes_per_layer(2048, 1, 12288, 96)
    )
    assert ratio == pytest.approx(34 / 114)
    with pytest.raises(ValueError, match="recompute must be one of"):
        memory.block_activation_terms(8, 2, 16, 4, recompute="partial")


def test_block_flops_by_hand() -> None:
    s, b, h = 8, 2, 16
    f = memory.block_flops(s, b, h)
    # Narayanan et al. 2021: 24sbh² + 4bs²h per layer forward (f = 4h)
    assert f["forward"] == 24 * s * b * h * h + 4 * b * s * s * h
    assert f["backward"] == 2 * f["forward"] and f["recompute"] == 0
    assert f["attention core"] == 4 * b * s * s * h
    full = memory.block_flops(s, b, h, recompute="full")
    assert full["recompute"] == f["forward"] - 2 * s * b * 4 * h * h  # fc2 is not run again
    assert (
        memory.block_flops(s, b, h, recompute="full", early_stop=False)["recompute"]
        == (f["forward"])
    )
    assert memory.block_flops(s, b, h, recompute="selective")["recompute"] == 2 * b * s * s * h
    sel = memory.block_flops(s, b, h, recompute="selective", early_stop=False)
    assert sel["recompute"] == f["attention core"]
    assert memory.block_flops(s, b, h, ffn_hidden=24)["forward"] == (
        8 * s * b * h * h + 4 * s * b * h * 24 + 4 * b * s * s * h
    )
    with pytest.raises(ValueError, match="recompute must be one of"):
        memory.block_flops(s, b, h, recompute="some")
    with pytest.raises(ValueError, match="hidden must be an int >= 1"):
        memory.block_flops(s, b, 0)


# --- measured on labkit's block --------------------------------------------------------------


def _stack(h: int, a: int, f: int, n: int = 2) -> nn.Sequential:
    return nn.Sequential(*[TransformerBlock(h, n_heads=a, hidden=f, seed=5 + i) for i in range(n)])


def _run(model: nn.Module, x: torch.Tensor, kernel) -> tuple[int, dict, torch.Tensor]:
    """Saved bytes of one forward, then the parameter and input gradients of its backward."""
    x = x.detach().requires_grad_(True)
    with sdpa_kernel(kernel) if kernel is not None else contextlib.nullcontext():
        with lk.profile.saved_tensors(exclude=model.parameters()) as saved:
            y = model(x)
        y.square().sum().backward()
    return saved.total_bytes, {n: p.grad for n, p in model.named_parameters()}, x.grad


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("attention", list(KERNELS))
def test_apply_ac_modes_keep_what_the_model_says(shape, attention) -> None:
    B, T, h, a, f = shape
    x = torch.randn(B, T, h, generator=torch.Generator().manual_seed(1))
    kernel = KERNELS[attention]
    _, ref_grads, ref_dx = _run(_stack(h, a, f), x, kernel)
    for mode in MODES:
        model = _stack(h, a, f)
        if mode != "none":
            apply_ac(model, ["0", "1"], mode=mode)
        got, grads, dx = _run(model, x, kernel)
        want = 2 * memory.block_activation_bytes(T, B, h, a, **_labkit(f, attention),
                                                 recompute=mode)  # fmt: skip
        assert got == want, (mode, got, want)
        torch.testing.assert_close(dx, ref_dx, rtol=0, atol=0)  # the same arithmetic again
        for n, g in ref_grads.items():
            torch.testing.assert_close(grads[n], g, rtol=0, atol=0, msg=n)


@pytest.mark.parametrize("early_stop", [True, False])
def test_counted_products_are_block_flops(early_stop: bool) -> None:
    B, T, h, a, f = SHAPES[1]
    x = torch.randn(B, T, h)
    for mode in MODES:
        block = TransformerBlock(h, n_heads=a, hidden=f, seed=0)
        if mode != "none":
            apply_ac(block, [""], mode=mode)  # "": the block itself
        counter = FlopCounterMode(display=False)
        with set_checkpoint_early_stop(early_stop), sdpa_kernel(SDPBackend.MATH), counter:
            y = block(x.clone().requires_grad_(True))
            forward = counter.get_total_flops()
            y.sum().backward()
        want = memory.block_flops(T, B, h, ffn_hidden=f, recompute=mode, early_stop=early_stop)
        assert forward == want["forward"]
        assert counter.get_total_flops() - forward == want["backward"] + want["recompute"]


def test_apply_ac_modes_are_checked() -> None:
    model = _stack(8, 2, 16)
    with pytest.raises(ValueError, match="mode must be one of"):
        apply_ac(model, ["0"], mode="half")
    apply_ac(model, ["0"], mode="selective")
    apply_ac(model, ["0"], mode="selective")  # again: nothing changes
    with pytest.raises(ValueError, match="already checkpointed with mode='selective'"):
        apply_ac(model, ["0"], mode="full")
    assert lk.parallel.compose.ac.is_checkpointed(model[0])
    assert not lk.parallel.compose.ac.is_checkpointed(model[1])
    with pytest.raises(ValueError, match="has no SelfAttention"):
        apply_ac(nn.Sequential(lk.models.FeedForward(8, 16)), ["0"], mode="selective")
