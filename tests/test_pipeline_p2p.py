"""The stages' p2p is safe on NCCL: each step's sends and receive go as one batch, bounded.

On CPU the batches are observed directly: every rank wraps ``dist.batch_isend_irecv`` to
note each batch's operations, and ``labkit_record`` (over gloo) records every send and recv
that reached the backend, so a send or recv issued outside a batch would show up as a
record no batch accounts for. The model split's chain order (receive, then send on, never
both at once) is read from the same records.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from torch import nn

import labkit as lk
from labkit.backends import recording
from labkit.parallel.model_split.runtime import ModelSplit, split_model
from labkit.parallel.pipeline import p2p, runtime, schedules, wire


def _watch_batches() -> list[list[tuple[str, int, int]]]:
    """Wrap ``dist.batch_isend_irecv`` in this rank; return the list it fills."""
    batches: list[list[tuple[str, int, int]]] = []
    real = dist.batch_isend_irecv

    def batch(ops):
        batches.append(
            [("send" if o.op is dist.isend else "recv", o.group_peer, o.tag) for o in ops]
        )
        return real(ops)

    dist.batch_isend_irecv = batch
    return batches


def _pipeline(rank: int, world_size: int, schedule_name: str) -> dict:
    batches = _watch_batches()
    torch.manual_seed(0)
    n_stages, m = world_size, 4
    model = nn.Sequential(*[nn.Linear(6, 6) for _ in range(n_stages)])
    stages = dict(enumerate(runtime.split_sequential(model, n_stages)))
    mine = {s: stages[s] for s in runtime.stages_of_rank(rank, world_size, n_stages)}
    inputs = [torch.randn(3, 6) for _ in range(m)]
    targets = [torch.randn(3, 6) for _ in range(m)]
    shapes = runtime.output_shapes(list(stages.values()), inputs[0])
    sched = getattr(schedules, schedule_name)(world_size, m)
    recording.clear()
    result = runtime.run_schedule(sched, mine, inputs, targets, nn.functional.mse_loss, shapes)
    recs = [(r.op, r.peer) for r in recording.records() if r.op in ("send", "recv")]
    return {"batches": batches, "records": recs, "n_sends": result.n_sends}


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("schedule_name", ["gpipe", "one_f_one_b"])
def test_every_pipeline_step_issues_its_sends_and_receive_as_one_batch(world_size, schedule_name):
    results = lk.launch(
        _pipeline,
        world_size=world_size,
        backend="labkit_record",
        timeout=240,
        args=(schedule_name,),
    )
    fused = 0
    for rank, got in enumerate(results):
        batches = got["batches"]
        ops = [op for b in batches for op in b]
        # Every p2p that reached the backend was part of a batch, in the same order.
        assert [(k, peer) for k, peer, _ in ops] == got["records"], rank
        assert sum(k == "send" for k, _, _ in ops) == got["n_sends"] > 0
        for b in batches:
            kinds = [k for k, _, _ in b]
            # At most one receive per batch, issued after the sends queued before it.
            assert kinds.count("recv") <= 1 and (kinds[-1] == "recv" or "recv" not in kinds)
            fused += "recv" in kinds and "send" in kinds
        # Neighbours only: stage s talks to s-1 and s+1.
        assert {peer for _, peer, _ in ops} <= {(rank - 1) % world_size, (rank + 1) % world_size}
    # The steady state pairs a send with the next receive (1F1B: F's send with B's recv).
    assert fused > 0


def _never_sent(rank: int, world_size: int) -> str:
    ex = p2p.Exchange(None, timedelta(seconds=1.5))
    if rank == 1:
        try:
            ex.recv(torch.empty(3), 0)
        except RuntimeError as exc:
            msg = str(exc)
        else:
            msg = "no error"
    else:
        msg = ""  # sends nothing; a timed-out gloo pair is closed, so no barrier follows
    return msg


@pytest.mark.parametrize("backend", ["gloo", "labkit_shm"])
def test_a_receive_that_gets_no_message_times_out(backend):
    msgs = lk.launch(_never_sent, world_size=2, backend=backend, timeout=120)
    assert "Timed out" in msgs[1] or "timed out" in msgs[1], msgs[1]


def _model_split(rank: int, world_size: int) -> list[tuple[str, int]]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(world_size)])
    stage = split_model(model, world_size)[rank]
    split = ModelSplit(stage, [(2, 4)] * world_size, nn.functional.mse_loss)
    recording.clear()
    x = torch.randn(2, 4) if rank == 0 else None
    target = torch.randn(2, 4) if rank == world_size - 1 else None
    split.step(x, target)
    return [(r.op, r.peer) for r in recording.records() if r.op in ("send", "recv")]


@pytest.mark.parametrize("world_size", [2, 3])
def test_model_split_p2p_is_a_chain_that_cannot_form_a_cycle(world_size):
    results = lk.launch(_model_split, world_size=world_size, backend="labkit_record", timeout=240)
    last = world_size - 1
    for r, ops in enumerate(results):
        forward = [("recv", r - 1)] * (r > 0) + [("send", r + 1)] * (r < last)
        backward = [("recv", r + 1)] * (r < last) + [("send", r - 1)] * (r > 0)
        # Each rank receives before it sends, and only from the side the data comes from:
        # rank r waits only for rank r-1 (forward) or r+1 (backward), never in a circle.
        assert ops == forward + backward, (r, ops)


class _OneWork:
    """NCCL's answer to a batch: one Work for all its operations; notes each wait's timeout."""

    def __init__(self, waits: list) -> None:
        self.waits = waits

    def wait(self, timeout=None) -> bool:
        self.waits.append(timeout)
        return True


def _nccl_shaped_batches(rank: int, world_size: int) -> list:
    waits: list = []
    dist.batch_isend_irecv = lambda ops: [_OneWork(waits)]  # the shape NCCL returns
    ex = p2p.Exchange(None, timedelta(seconds=7))
    ex.send(torch.ones(2), 1 - rank)
    ex.recv(torch.empty(2), 1 - rank)  # one batch: send + recv, one Work
    ex.send(torch.ones(2), 1 - rank)
    ex.finish()  # a batch of one send
    return waits


def test_every_wait_of_an_nccl_shaped_batch_carries_the_timeout():
    # On NCCL Work.wait() without a timeout only orders the current stream; with one the host
    # blocks until the batch is done, or raises when it is not done in time.
    waits = lk.launch(_nccl_shaped_batches, world_size=2, backend="gloo", device="cpu", timeout=60)
    assert waits == [[timedelta(seconds=7)] * 2] * 2


def _stage_that_never_sends(rank: int, world_size: int) -> dict:
    devices = []
    real = runtime.span

    def span(name, kind="compute", *, device=None, **args):
        devices.append((name, kind, device))
        return real(name, kind, device=device, **args)

    runtime.span = wire.span = span  # actions' spans (runtime) and waits for messages (wire)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    mine = {rank: runtime.split_sequential(model, 2)[rank]}
    inputs, targets = [torch.randn(2, 4)] * 2, [torch.randn(2, 4)] * 2
    shapes = runtime.output_shapes(runtime.split_sequential(model, 2), inputs[0])
    sched = schedules.gpipe(2, 2)
    args = (sched, mine, inputs, targets, nn.functional.mse_loss, shapes)
    runtime.run_schedule(*args, timeout_s=60)  # one good step: both stages run
    dist.barrier()
    error = ""
    if rank == 1:  # stage 0 skips the second step: stage 1's first receive gets nothing
        try:
            runtime.run_schedule(*args, timeout_s=1.5)
        except RuntimeError as exc:
            error = str(exc)
        else:
            error = "no error"
    return {"devices": devices, "error": error}


def test_a_stage_that_never_sends_ends_the_step_with_a_clear_timeout():
    out = lk.launch(_stage_that_never_sends, world_size=2, backend="gloo", device="cpu", timeout=90)
    error = out[1]["error"]
    assert error.startswith("pipeline rank 1, action 1F0: no message from stage 0 (rank 0"), error
    assert "within 1.5 s (timeout_s)" in error and "Timed out" in error, error
    for got in out:
        # Every span the runtime records is told its tensors' device (synchronised on a GPU).
        kinds = {kind for _, kind, _ in got["devices"]}
        assert kinds == {"compute", "comm"}, got["devices"]
        assert all(d == torch.device("cpu") for _, _, d in got["devices"]), got["devices"]


@pytest.mark.parametrize(
    ("backend", "device", "warms"),
    [
        ("nccl", "cuda:0", True),
        ("cpu:gloo,cuda:nccl", "cuda:1", True),  # the device rule's backend on a GPU
        ("cpu:gloo,cuda:nccl", "cpu", False),  # CPU tensors go over gloo
        ("gloo", "cpu", False),
    ],
)
def test_warm_up_runs_once_exactly_when_the_tensors_go_over_nccl(
    monkeypatch, backend, device, warms
) -> None:
    from types import SimpleNamespace

    reduced = []
    fake = SimpleNamespace(
        get_backend=lambda group: backend,
        group=SimpleNamespace(WORLD=SimpleNamespace(group_name=f"test-{backend}-{device}")),
        all_reduce=lambda t, group=None: reduced.append(t),
    )
    monkeypatch.setattr(p2p, "dist", fake)
    zeros = lambda n, device: ("zeros", device)  # noqa: E731 - a CUDA tensor on a CPU build
    monkeypatch.setattr(p2p, "torch", SimpleNamespace(zeros=zeros, device=torch.device))
    monkeypatch.setattr(p2p, "_warm", set())
    for _ in range(2):  # the second step finds the group warm
        p2p.warm_up(None, torch.device(device))
    assert reduced == [("zeros", torch.device(device))] * warms
