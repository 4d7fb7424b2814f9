"""Tests for labkit/parallel/ddp/hooks.py: PowerSGD with several buckets on CPU backends.

torch's ``powerSGD_hook`` issues each bucket's P and Q all-reduces from future callbacks. On
gloo, ``labkit_simnet`` and ``labkit_simlink`` those run on whichever thread completes the
bucket's first all-reduce, so with more than one bucket the ranks issued their collectives in
different orders: without ``in_bucket_order`` the run below failed 9 times in 9 (3 per
backend: gloo's "Received data size doesn't match expected size" abort, or a hang until the
launch's timeout). Here every rank must issue the same collectives in the same order, one
bucket after another, and the three backends must train to the same parameters.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

import labkit as lk
from labkit.backends import recording

WIDTH, DEPTH, STEPS, START = 32, 6, 6, 2  # PowerSGD from step START on
# Two Linear layers' gradients per bucket: DEPTH / 2 = 3 buckets.
CAP_MB = 2 * WIDTH * (WIDTH + 1) * 4 / 2**20


def _train(rank: int, world_size: int) -> tuple[list[list[tuple[str, int]]], torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(DEPTH)])
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=CAP_MB)
    state = psgd.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=START)
    ddp.register_comm_hook(state, lk.parallel.ddp.in_bucket_order(psgd.powerSGD_hook))
    g = torch.Generator().manual_seed(rank)
    steps = []
    for _ in range(STEPS):
        recording.clear()
        ddp(torch.randn(8, WIDTH, generator=g)).square().mean().backward()
        ddp.zero_grad()
        steps.append([(r.op, r.n_bytes) for r in recording.records()])
    return steps, torch.cat([p.detach().flatten() for p in model.parameters()])


BACKENDS = {
    "gloo": lambda: recording.spec("gloo"),
    "labkit_simlink": lambda: recording.spec(lk.backends.simlink.spec("10GbE")),
    "labkit_simnet": lambda: recording.spec(lk.backends.simnet.spec("10GbE")),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, list]:
    return {
        name: lk.launch(_train, 2, backend=make(), timeout=lk.stretch(60))
        for name, make in BACKENDS.items()
    }


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_every_rank_issues_powersgds_collectives_in_one_order(runs, backend: str) -> None:
    (steps0, _), (steps1, _) = runs[backend]
    assert steps0 == steps1
    # Step 0 runs one bucket (DDP's first bucket holds up to 1 MiB); then DDP rebuilds them.
    plain, compressed = steps0[1], steps0[-1]
    bucket = 2 * WIDTH * (WIDTH + 1) * 4
    assert [n for op, n in plain if op == "all_reduce"] == [bucket] * 3  # before START
    # From START on, per bucket: the biases whole, then P, then Q (rank 2: WIDTH x 2 each).
    pq = 2 * WIDTH * 2 * 4  # bytes of two layers' P (or Q)
    assert [n for _, n in compressed] == [2 * WIDTH * 4, pq, pq] * 3


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_ranks_agree_and_backends_train_alike(runs, backend: str) -> None:
    (_, params0), (_, params1) = runs[backend]
    assert torch.equal(params0, params1)
    # The simulated networks delay, they do not change what gloo computes.
    torch.testing.assert_close(params0, runs["gloo"][0][1], rtol=0, atol=0)
