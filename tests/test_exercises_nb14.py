"""Tests for labkit/exercises/nb14.py: the reference passes, plausible wrong counts fail.

Each wrong answer is the reference count with one mistake a learner might make; the checker
measures labkit's block with saved-tensor hooks on three shapes (batch ≠ sequence, several
heads, MLP widths that are not 4h), in every recompute mode and with both attention kernels.
"""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.exercises import ExerciseFailed, nb14

NAME = "14_saved_bytes"
MODES = ("none", "selective", "full")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models in this process: one thread is faster than two on a shared 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb14.saved_bytes
    detail = ex.checker(ex.reference)
    assert detail["cases"] == [list(c) for c in nb14.CASES]
    assert len(detail["measured"]) == len(nb14.CASES) * 3 * 2
    for b, s, _, a, _ in nb14.CASES:  # the shapes catch swapped or dropped sizes
        assert b != s and a > 1
    assert any(f != 4 * h for _, _, h, _, f in nb14.CASES)


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(batch, seq_len, hidden, n_heads, ffn_hidden, recompute, attention):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def test_prompt_gives_no_count() -> None:
    prompt = lk.exercises.get(NAME).prompt
    assert "34" not in prompt and "sbh" not in prompt and "log-sum-exp" not in prompt


def _by_hand(b, s, h, a, f, recompute, attention, *, probabilities=True, lse=True, stats=True,
             input_twice=False, selective_as_full=False, selective_drops_qkv=False, bytes_per=4,
             swap_bt=False, one_head=False, mlp_4h=False, full_keeps_output=False):  # fmt: skip
    """The bytes by hand, tensor by tensor, with one mistake switched on."""
    e, sbh = bytes_per, s * b * h
    ff = 4 * h if mlp_4h else f
    heads = 1 if one_head else a
    t2 = b * s if swap_bt else s * s  # the s×s probabilities per head and sequence
    if recompute == "full" or (recompute == "selective" and selective_as_full):
        return e * sbh * (2 if full_keeps_output else 1)
    ln = e * sbh + (2 * 4 * s * b if stats else 0)  # input, mean and 1/σ per token
    qkv_in = e * sbh  # the LayerNorm output q, k and v read: one storage
    qkv = 3 * e * sbh
    if recompute == "selective":
        core = 0
        if selective_drops_qkv:
            qkv = 0
    elif attention == "softmax":
        core = e * b * heads * t2 if probabilities else 0
    else:
        core = 4 * b * heads * s if lse else 0
    proj_in = e * sbh
    mlp = e * sbh + 2 * e * s * b * ff  # fc1, GELU and fc2 inputs
    total = 2 * ln + qkv_in + qkv + core + proj_in + mlp
    return total + (e * sbh if input_twice else 0)


def _wrong(**mistake):
    return lambda *args: _by_hand(*args, **mistake)


def test_by_hand_without_mistakes_passes() -> None:
    assert lk.exercises.check(NAME, _wrong()).status == "passed"
    assert lk.exercises.check(NAME, lambda *a: float(_by_hand(*a))).status == "passed"


WRONG = {
    "forgets-the-probabilities": (
        _wrong(probabilities=False),
        r"short — the size of .*'softmax output'",
    ),
    "forgets-the-log-sum-exp": (_wrong(lse=False), r"short — the size of .*'log-sum-exp'"),
    "misses-layernorm-statistics": (
        _wrong(stats=False),
        r"short — the size of .*'ln1 mean and 1/σ' \+ 'ln2 mean and 1/σ'",
    ),
    "counts-the-input-twice": (_wrong(input_twice=True), r"over — the size of .*'ln1 input'"),
    "full-keeps-input-and-output": (_wrong(full_keeps_output=True), r"recompute='full'.*over"),
    "selective-as-full": (_wrong(selective_as_full=True), r"recompute='selective'.*short"),
    "selective-drops-q-k-v": (_wrong(selective_drops_qkv=True), r"recompute='selective'.*short"),
    "korthikanti-16-bit": (_wrong(bytes_per=2), r"recompute='none'.*short"),
    "batch-for-sequence-in-s²": (_wrong(swap_bt=True), r"attention='softmax'"),
    "one-head": (_wrong(one_head=True), r"n_heads=2.*short"),
    "mlp-always-4h": (_wrong(mlp_4h=True), r"ffn_hidden=20"),
    "kilobytes": (lambda *a: nb14.saved_bytes(*a) / 1000, r"a count of bytes is an int"),
    "raises": (lambda *a: {}["x"], r"raised KeyError"),
}


@pytest.mark.parametrize("case", list(WRONG))
def test_wrong_answers_fail_with_a_reason(case: str) -> None:
    wrong, match = WRONG[case]
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)


def test_every_mode_and_kernel_is_measured_not_modelled() -> None:
    # a count right for the flash kernel alone fails on the math kernel's probabilities
    def flash_only(b, s, h, a, f, recompute, attention):
        return nb14.saved_bytes(b, s, h, a, f, recompute, "flash")

    with pytest.raises(ExerciseFailed, match=r"attention='softmax'.*short"):
        lk.exercises.check(NAME, flash_only)
    for mode in MODES:
        assert nb14.measure(nb14.CASES[0], mode, "flash") == nb14.saved_bytes(
            *nb14.CASES[0], mode, "flash"
        )
