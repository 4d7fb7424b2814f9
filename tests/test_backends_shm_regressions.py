"""Regressions found by PyTorch's own distributed suite on labkit_shm (``tests/dist_suite.py``).

Each test fails on the code before its fix:

1. ``all_gather_coalesced`` read torch's ``output_lists[rank][j]`` as ``[j][rank]``: with as
   many inputs as ranks it returned the outputs transposed, without an error.
2. A collective or a recv on a tensor that requires grad (DDP with ``create_graph=True``)
   failed with ``add(): functions with out=... arguments don't support automatic
   differentiation`` and left the group broken.
3. A rank aborted at exit (SIGABRT) after send/recv and ``destroy_process_group()``: the p2p
   progress thread, a daemon, was still running when the interpreter finalized.

And the launcher refuses ``labkit_shm`` with ``device="cuda"`` before starting anything.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from tests.launch_helpers import ROOT


def _all_gather_coalesced(rank: int, world_size: int) -> dict:
    """Every rank gathers its inputs through labkit_shm and through a gloo group."""
    gloo = dist.new_group(backend="gloo")
    got = {}
    # 1a: as many inputs as ranks, equal shapes: the case that came back transposed.
    square = [torch.tensor([10.0 * rank + j]) for j in range(world_size)]
    # 1b: more inputs than ranks, different shapes: the case that raised a wrong message.
    ragged = [torch.full((j + 1,), 100.0 * rank + j) for j in range(world_size + 1)]
    for name, inputs in (("square", square), ("ragged", ragged)):
        for backend, group in (("shm", None), ("gloo", gloo)):
            outs = [[torch.empty_like(t) for t in inputs] for _ in range(world_size)]
            dist.all_gather_coalesced(outs, inputs, group=group)
            got[f"{name}/{backend}"] = [[t.tolist() for t in per_rank] for per_rank in outs]
    return got


def test_all_gather_coalesced_returns_rank_major_lists_not_transposed():
    results = lk.launch(_all_gather_coalesced, world_size=2, backend="labkit_shm", timeout=120)
    for got in results:
        # outs[r][j] is rank r's input j: rank 0 passed [0, 1], rank 1 passed [10, 11].
        assert got["square/shm"] == [[[0.0], [1.0]], [[10.0], [11.0]]], got["square/shm"]
        assert got["square/shm"] == got["square/gloo"]
        assert got["ragged/shm"] == got["ragged/gloo"]
        assert got["ragged/shm"][1][2] == [102.0, 102.0, 102.0]


def _wrong_lists(rank: int, world_size: int) -> str:
    inputs = [torch.zeros(2), torch.zeros(2)]
    outs = [[torch.zeros(2), torch.zeros(2)]]  # one list, but world_size lists are needed
    try:
        dist.all_gather_coalesced(outs, inputs)
    except ValueError as exc:
        return str(exc)
    return "no error"


def test_all_gather_coalesced_names_the_expected_layout_of_its_output_lists():
    msgs = lk.launch(_wrong_lists, world_size=2, backend="labkit_shm", timeout=120)
    for msg in msgs:
        assert "world_size=2 lists (one per rank) of 2 tensors" in msg, msg


class _Scaled(torch.nn.Module):
    """``sum((p * x) ** 2)`` with one parameter vector ``p``."""

    def __init__(self) -> None:
        super().__init__()
        self.p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 0.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.p * x).pow(2).sum()


def _with_grad(rank: int, world_size: int) -> dict:
    """Collectives and p2p on tensors that require grad; then DDP with create_graph=True."""
    torch.manual_seed(0)
    x = torch.full((4,), float(rank + 1), requires_grad=True)
    dist.all_reduce(x)
    bcast = torch.full((3,), float(rank), requires_grad=True)
    dist.broadcast(bcast, src=1)
    peer = 1 - rank
    buf = torch.zeros(5, requires_grad=True)
    mine = torch.full((5,), float(rank + 7), requires_grad=True)
    if rank == 0:
        dist.send(mine, peer)
        dist.recv(buf, peer)
    else:
        dist.recv(buf, peer)
        dist.send(mine, peer)
    # DDP with create_graph=True (as torch's test_ddp_create_graph: one parameter, so one
    # bucket): the reducer all-reduces gradients that require grad themselves. gloo computes
    # the reference on the same data.
    grads = {}
    for name, group in (("shm", None), ("gloo", dist.new_group(backend="gloo"))):
        model = _Scaled()
        ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        for step in range(3):
            ddp(torch.tensor([1.0, 2.0, 3.0]) * (rank + 1 + step)).backward(create_graph=True)
        assert model.p.grad.requires_grad
        grads[name] = model.p.grad.detach().clone()
    return {
        "all_reduce": x.detach().tolist(),
        "requires_grad_kept": x.requires_grad and buf.requires_grad,
        "broadcast": bcast.detach().tolist(),
        "recv": buf.detach().tolist(),
        "ddp_shm": grads["shm"],
        "ddp_gloo": grads["gloo"],
        "usable_after": dist.all_reduce(torch.ones(1)) is None,
    }


def test_collectives_and_p2p_accept_tensors_that_require_grad():
    results = lk.launch(_with_grad, world_size=2, backend="labkit_shm", timeout=180)
    for rank, got in enumerate(results):
        assert got["all_reduce"] == [3.0] * 4
        assert got["broadcast"] == [1.0] * 3
        assert got["recv"] == [float(1 - rank + 7)] * 5
        assert got["requires_grad_kept"] and got["usable_after"]
        torch.testing.assert_close(got["ddp_shm"], got["ddp_gloo"], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(results[0]["ddp_shm"], results[1]["ddp_shm"], rtol=0, atol=0)


_SEND_RECV_EXIT = """
import sys, threading
import torch
import torch.distributed as dist
import labkit.backends.shm  # registers labkit_shm

rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("labkit_shm", init_method=init, rank=rank, world_size=2)
for step in range(20):
    t = torch.full((1000,), float(step))
    if rank == 0:
        dist.send(t, 1)
        dist.recv(t, 1)
    else:
        dist.recv(t, 0)
        dist.send(t, 0)
if {destroy}:
    dist.destroy_process_group()
    alive = [th.name for th in threading.enumerate() if th.name.startswith("labkit_shm p2p")]
    assert not alive, f"still running after destroy_process_group: {{alive}}"
sys.exit(0)
"""


@pytest.mark.parametrize("destroy", [True, False], ids=["destroyed", "not-destroyed"])
def test_every_rank_exits_cleanly_after_send_recv(tmp_path, destroy):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    code = textwrap.dedent(_SEND_RECV_EXIT.format(destroy=destroy))
    codes = []
    for run in range(3):  # the abort hit 5 of 6 such runs before the fix
        init = f"file://{tmp_path}/init-{run}"
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", code, str(r), init],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(2)
        ]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        codes.append([p.returncode for p in procs])
        assert codes[-1] == [0, 0], f"run {run}: exit codes {codes[-1]}\n" + "\n".join(outs)
        assert "terminate called" not in "".join(outs)


def test_launch_refuses_labkit_shm_on_cuda_before_starting_ranks():
    with pytest.raises(ValueError, match=r"backend='labkit_shm' moves CPU tensors only"):
        lk.launch(lambda rank, world_size: rank, world_size=2, backend="labkit_shm", device="cuda")
