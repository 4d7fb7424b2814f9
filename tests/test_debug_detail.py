"""``TORCH_DISTRIBUTED_DEBUG=DETAIL`` catches mismatched collectives on gloo (notebook 19, §5).

With the checker on, ranks that call different collectives, or one collective with different
shapes, raise at once with a report naming each rank's operation and shapes; without it the
same bug waits out the group's timeout and names nothing. The variable reaches ``lk.launch``'s
forked ranks through ``env=`` (the launcher reads it again in each rank) and torchrun's workers
through their environment.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.debug import parse_collective_mismatch, run_torchrun

DETAIL = {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
GROUP_TIMEOUT_S = 1.5


def _mismatch(rank, world_size, kind, seconds):
    """Run a wrong collective in a group with a short timeout; return (error or None, seconds)."""
    group = dist.new_group(list(range(world_size)), timeout=timedelta(seconds=seconds))
    t = torch.ones(3 if kind == "shape" and rank == 0 else 4)
    start = time.perf_counter()
    try:
        if kind == "shape" or rank == 0:
            dist.all_reduce(t, group=group)
        else:
            dist.broadcast(t, src=1, group=group)
    except RuntimeError as exc:
        return str(exc), time.perf_counter() - start
    return None, time.perf_counter() - start


def test_detail_names_each_ranks_shape_of_a_mismatched_all_reduce():
    out = lk.launch(_mismatch, 2, backend="gloo", args=("shape", GROUP_TIMEOUT_S), env=DETAIL)
    reports = [parse_collective_mismatch(err or "") for err, _ in out]
    assert all(r is not None for r in reports), out
    assert all(seconds < GROUP_TIMEOUT_S for _, seconds in out), "it must not wait for a timeout"
    assert [(r.this.rank, r.this.op, r.this.shapes) for r in reports] == [
        (0, "ALLREDUCE", ((3,),)),
        (1, "ALLREDUCE", ((4,),)),
    ]
    assert [(r.other.rank, r.other.shapes) for r in reports] == [(1, ((4,),)), (0, ((3,),))]
    assert all(r.differences == ("tensor shapes",) for r in reports)
    assert "Detected mismatch between collectives on ranks" in out[0][0]


def test_detail_names_the_operations_when_ranks_call_different_collectives():
    out = lk.launch(_mismatch, 2, backend="gloo", args=("op", GROUP_TIMEOUT_S), env=DETAIL)
    reports = [parse_collective_mismatch(err or "") for err, _ in out]
    assert [(r.this.op, r.other.op) for r in reports] == [
        ("ALLREDUCE", "BROADCAST"),
        ("BROADCAST", "ALLREDUCE"),
    ]
    assert all(r.differences == ("op type",) for r in reports)


def test_without_detail_the_same_bug_is_a_timeout_that_names_nothing():
    out = lk.launch(_mismatch, 2, backend="gloo", args=("op", GROUP_TIMEOUT_S))
    for err, seconds in out:
        assert err is not None and "Timed out" in err and seconds >= GROUP_TIMEOUT_S
        assert parse_collective_mismatch(err) is None
        assert "ALLREDUCE" not in err and "BROADCAST" not in err


def _skip_one(rank, world_size):
    t = torch.ones(2)
    try:
        dist.all_reduce(t)
        if rank == 0:
            dist.all_reduce(t)
        dist.broadcast(t, src=0)
    except RuntimeError as exc:
        return parse_collective_mismatch(str(exc))
    return None


def test_detail_catches_a_skipped_collective_at_its_sequence_number():
    a, b = lk.launch(_skip_one, 2, backend="gloo", env=DETAIL)
    assert (a.this.op, b.this.op) == ("ALLREDUCE", "BROADCAST")
    assert a.this.sequence_number == b.this.sequence_number == 1


def _wrapped(rank, world_size):
    cpu = torch.device("cpu")
    default = type(dist.group.WORLD._get_backend(cpu)).__name__
    dist.set_debug_level(dist.DebugLevel.DETAIL)
    later = type(dist.new_group([0, 1])._get_backend(cpu)).__name__
    return str(dist.get_debug_level()), default, later


def test_set_debug_level_in_a_rank_wraps_only_the_groups_created_after_it():
    assert lk.launch(_wrapped, 2, backend="gloo")[0] == (
        "DebugLevel.DETAIL",
        "ProcessGroupGloo",
        "_ProcessGroupWrapper",
    )
    assert lk.launch(_wrapped, 2, backend="gloo", env=DETAIL)[0][1] == "_ProcessGroupWrapper"


@pytest.mark.slow  # torchrun starts two fresh interpreters (~6 s)
def test_detail_under_torchrun_catches_the_skipped_collective(tmp_path):
    run = run_torchrun(
        "labkit.scripts.debug_collectives",
        ["--mismatch", "skip", "--report", f"{tmp_path}/rank_"],
        env=DETAIL,
    )
    assert run.returncode == 0, run.output[-3000:]
    workers = [json.loads((tmp_path / f"rank_{r}.json").read_text()) for r in range(2)]
    assert [w["debug_level"] for w in workers] == ["DETAIL", "DETAIL"]
    reports = [parse_collective_mismatch(w["error"]) for w in workers]
    assert [(r.this.rank, r.this.op, r.other.op) for r in reports] == [
        (0, "ALLREDUCE", "BROADCAST"),
        (1, "BROADCAST", "ALLREDUCE"),
    ]
    # torchrun's agent starts its workers with TORCH_NCCL_ASYNC_ERROR_HANDLING=1 unless it is set.
    expected = os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    assert {w["settings"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] for w in workers} == {expected}
