"""``labkit.debug.flight_recorder``: dumps written by ranks on gloo, read back and compared.

What torch 2.13 records on gloo is checked here as well as in notebook 19: collectives with
their per-group sequence numbers, not send/recv; ``TORCH_FR_BUFFER_SIZE`` sizes the buffer.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

import labkit as lk
from labkit.debug import (
    behind,
    compare_ranks,
    describe_positions,
    dump_flight_recorder,
    fr_entries,
    load_flight_recorder,
    load_flight_recorders,
)


def _entry(group: str, seq: int, op: str = "gloo:all_reduce", p2p: bool = False) -> dict:
    return {
        "process_group": (group, "undefined"),
        "collective_seq_id": seq,
        "profiling_name": op,
        "input_sizes": [[3]],
        "state": "scheduled",
        "is_p2p": p2p,
    }


def test_compare_ranks_finds_the_rank_behind():
    dumps = {
        0: {"entries": [_entry("1", 1), _entry("1", 2), _entry("1", 3)]},
        1: {"entries": [_entry("1", 1), _entry("1", 2), _entry("1", 0, "gloo:recv", True)]},
    }
    positions = compare_ranks(dumps)
    assert [p.seq for p in positions["1"].values()] == [3, 2]  # the recv is not a collective
    assert behind(positions["1"]) == [1]
    lines = describe_positions(positions)
    assert lines[0] == "group 1: rank 0 last issued #3 gloo:all_reduce [[3]]"
    assert lines[1].startswith("group 1: rank 1 last issued #2") and "behind" in lines[1]


def test_a_rank_that_recorded_nothing_in_a_group_is_at_zero():
    positions = compare_ranks({0: {"entries": [_entry("0", 1)]}, 1: {"entries": []}})
    assert positions["0"][1].seq == 0 and behind(positions["0"]) == [1]
    assert behind(compare_ranks({0: {"entries": [_entry("0", 4)]}})["0"]) == []


def _hang_and_dump(rank, world_size, prefix):
    group = dist.new_group([0, 1], timeout=timedelta(seconds=1.5))
    t = torch.ones(3)
    dist.all_reduce(t, group=group)
    dist.all_reduce(t, group=group)
    try:
        if rank == 0:
            dist.all_reduce(t, group=group)
        else:
            dist.recv(t, src=0, group=group)
    except RuntimeError:
        pass
    return str(dump_flight_recorder(prefix, rank))


def test_a_hang_on_gloo_is_located_from_the_ranks_dumps(tmp_path):
    paths = lk.launch(_hang_and_dump, 2, backend="gloo", args=(f"{tmp_path}/rank_",))
    assert paths == [f"{tmp_path}/rank_0", f"{tmp_path}/rank_1"]
    dumps = load_flight_recorders(tmp_path)
    assert sorted(dumps) == [0, 1] and load_flight_recorder(paths[0]) == dumps[0]
    (group,) = compare_ranks(dumps)
    positions = compare_ranks(dumps)[group]
    assert [(p.seq, p.op, p.input_sizes) for p in positions.values()] == [
        (3, "gloo:all_reduce", ((3,),)),
        (2, "gloo:all_reduce", ((3,),)),
    ]
    assert behind(positions) == [1]
    assert not any(e.is_p2p for d in dumps.values() for e in fr_entries(d))  # recv: not recorded


def _record(rank, world_size, n):
    import pickle

    import torch._C._distributed_c10d as c10d

    for _ in range(n):
        dist.all_reduce(torch.ones(1))
    return [e["collective_seq_id"] for e in pickle.loads(c10d._dump_fr_trace())["entries"]]


def test_the_buffer_size_comes_from_the_ranks_environment():
    assert lk.launch(_record, 2, backend="gloo", args=(3,))[0] == [1, 2, 3]
    assert (
        lk.launch(_record, 2, backend="gloo", args=(3,), env={"TORCH_FR_BUFFER_SIZE": "0"})[0] == []
    )
    kept = lk.launch(_record, 2, backend="gloo", args=(3,), env={"TORCH_FR_BUFFER_SIZE": "2"})
    assert kept[0] == [2, 3]  # a ring buffer: the newest entries stay
    older = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}  # the older name, read when the new one is unset
    assert lk.launch(_record, 2, backend="gloo", args=(1,), env=older)[0] == []
