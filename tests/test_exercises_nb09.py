"""Tests for labkit/exercises/nb09.py: the reference passes, wrong answers fail with a reason."""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit.exercises import ExerciseFailed, nb09

NAME = "09_accumulation_step"


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models in this process: one thread is faster than two on a shared 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb09.reference_step
    got = ex.checker(ex.reference)
    assert got == {"world_size": 2, "k": 4, "steps": 3, "all_reduces_per_step": 2}


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(model, optimizer, micro_batches, loss_fn):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _zero_grad_every_micro_batch(model, optimizer, micro_batches, loss_fn):
    for x, y in micro_batches:
        optimizer.zero_grad()
        (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def _no_loss_scaling(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(micro_batches):
        ctx = model.no_sync() if i < len(micro_batches) - 1 else torch.enable_grad()
        with ctx:
            loss_fn(model(x), y).backward()
    optimizer.step()


def _no_no_sync(model, optimizer, micro_batches, loss_fn):
    optimizer.zero_grad()
    for x, y in micro_batches:
        (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def _step_per_micro_batch(model, optimizer, micro_batches, loss_fn):
    for x, y in micro_batches:
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()


def _no_sync_everywhere(model, optimizer, micro_batches, loss_fn):
    """Never synchronises: each rank steps on its own gradient (hangs nothing, just wrong)."""
    optimizer.zero_grad()
    with model.no_sync():
        for x, y in micro_batches:
            (loss_fn(model(x), y) / len(micro_batches)).backward()
    optimizer.step()


def _raises(model, optimizer, micro_batches, loss_fn):
    raise ValueError("boom")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_zero_grad_every_micro_batch, "LAST micro-batch only"),
        (_no_loss_scaling, "divide each micro-batch's loss by k = 4"),
        (_no_no_sync, r"all-reduced \[8, 8\] times .* one round is 2"),
        (_step_per_micro_batch, "differ from one process"),
        (_no_sync_everywhere, "differ from one process"),
        (_raises, "ValueError: boom"),
    ],
)
def test_wrong_answers_fail_with_the_reason(fn, message: str) -> None:
    with pytest.raises(ExerciseFailed, match=message):
        lk.exercises.check(NAME, fn)


def test_the_known_mistakes_really_differ_from_the_large_batch() -> None:
    right = nb09.reference_params()
    for variant in ("last_micro_only", "unscaled"):
        wrong = nb09.reference_params(variant)
        assert (wrong[-1] - right[-1]).abs().max().item() > 1e-3
