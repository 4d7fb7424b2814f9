"""Tests for labkit/exercises/nb07.py: the reference passes, wrong answers fail with a reason."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

import labkit as lk
from labkit.exercises import ExerciseFailed, nb07

NAME = "07_bf16_compress_hook"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb07.bfloat16_compress_hook
    got = ex.checker(ex.reference)
    assert got["steps"] == nb07.STEPS
    assert got["float32_bytes_per_step"] == 4 * lk.models.count_parameters(nb07._model())
    assert got["in_flight"] >= nb07.IN_FLIGHT_MIN


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(process_group, bucket):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _compressed(dtype: torch.dtype, divide: bool = True):
    def hook(process_group, bucket):
        buffer = bucket.buffer()
        t = buffer.to(dtype)
        if divide:
            t.div_(dist.get_world_size())
        fut = dist.all_reduce(t, async_op=True).get_future()

        def done(fut):
            buffer.copy_(fut.value()[0])
            return buffer

        return fut.then(done)

    return hook


def _no_communication(process_group, bucket):
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())  # this rank's own gradients, not the average
    return fut


def _blocking(process_group, bucket):
    """Right numbers, no overlap: waits for the all-reduce, returns a completed future."""
    buffer = bucket.buffer()
    t = buffer.to(torch.bfloat16).div_(dist.get_world_size())
    dist.all_reduce(t)  # synchronous: backward stalls here
    buffer.copy_(t)
    fut = torch.futures.Future()
    fut.set_result(buffer)
    return fut


def _async_then_wait(process_group, bucket):
    """Issues the all-reduce asynchronously, then waits for it before returning."""
    fut = _compressed(torch.bfloat16)(process_group, bucket)
    fut.wait()
    return fut


def _raises(process_group, bucket):
    raise ValueError("boom")


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (_compressed(torch.bfloat16, divide=False), "divide by the world size"),
        (_compressed(torch.float32), r"all-reduced \['float32'\]"),
        (default_hooks.fp16_compress_hook, r"all-reduced \['float16'\]"),
        (_no_communication, "differs from DDP's average"),
        (_raises, "ValueError: boom"),
        (_blocking, "waited for its all-reduce"),
        (_async_then_wait, "already complete"),
    ],
)
def test_wrong_answers_fail_with_the_reason(fn, message: str) -> None:
    with pytest.raises(ExerciseFailed, match=message):
        lk.exercises.check(NAME, fn)
