"""labkit.parallel.ddp: naive, bucketed and torch DDP train exactly like one process.

Every rank trains its shard (``lk.data.shard_loader``: a ``DistributedSampler``) and the
single-process reference trains on the concatenation of what every rank saw in that step —
for a dataset size that the world size does not divide, padded duplicates included
(``drop_last=False``) or the tail dropped (``drop_last=True``). Parameters are compared after
every step. Communication is counted in ``tests/test_parallel_ddp_comm.py``.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data.distributed import DistributedSampler

import labkit as lk

N_SAMPLES = 23  # not divisible by 2 or 4
BATCH = 3  # per rank
EPOCHS = 2
LR = 0.2
IMPLS = ("naive", "bucketed", "torch")
# float32: the mean over the concatenated batch and the average of per-rank means add the
# same numbers in another order, compounded over 8 steps.
RTOL, ATOL = 1e-6, 2e-7  # measured: at most 3e-8 apart


def _model(kind: str) -> torch.nn.Module:
    if kind == "mlp":
        return lk.models.MLP(hidden=(32, 16), seed=0)
    return lk.models.CNN(channels=(4, 8), seed=0)


@functools.cache
def _dataset() -> torch.utils.data.TensorDataset:
    """The first 23 training digits, loaded once in the test process and shipped to ranks."""
    x, y = lk.data.digits("train").tensors
    return torch.utils.data.TensorDataset(x[:N_SAMPLES], y[:N_SAMPLES])


def _wrap(impl: str, model: torch.nn.Module) -> torch.nn.Module:
    from torch.nn.parallel import DistributedDataParallel

    if impl == "naive":
        return lk.parallel.ddp.DataParallelNaive(model)
    if impl == "bucketed":  # a small cap: several buckets, so ordering and overlap matter
        return lk.parallel.ddp.DataParallelBucketed(model, bucket_cap_mb=0.004)
    return DistributedDataParallel(model)


def _train(rank: int, world_size: int, kind: str, impls: tuple[str, ...], ds) -> dict:
    """Parameters after every step, per (impl, drop_last), as this rank sees them."""
    out = {}
    for impl in impls:
        for drop_last in (False, True):
            model = _model(kind)
            wrapped = _wrap(impl, model)
            opt = torch.optim.SGD(wrapped.parameters(), lr=LR)
            loader = lk.data.shard_loader(ds, BATCH, drop_last=drop_last, seed=0)
            snaps = []
            for epoch in range(EPOCHS):
                loader.sampler.set_epoch(epoch)
                for x, y in loader:
                    opt.zero_grad()
                    F.cross_entropy(wrapped(x), y).backward()
                    opt.step()
                    snaps.append([p.detach().clone() for p in model.parameters()])
            out[(impl, drop_last)] = snaps
            del wrapped, model, opt
    return out


def _reference(kind: str, world_size: int, drop_last: bool) -> list[list[torch.Tensor]]:
    """One process, global batch = every rank's batch of that step, in rank order."""
    ds = _dataset()
    model = _model(kind)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    samplers = [
        DistributedSampler(ds, world_size, r, shuffle=True, seed=0, drop_last=drop_last)
        for r in range(world_size)
    ]
    snaps = []
    for epoch in range(EPOCHS):
        shards = []
        for s in samplers:
            s.set_epoch(epoch)
            shards.append(list(s))
        for start in range(0, len(shards[0]), BATCH):
            idx = [i for shard in shards for i in shard[start : start + BATCH]]
            x, y = ds[idx]
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            snaps.append([p.detach().clone() for p in model.parameters()])
    return snaps


def _check(results: list[dict], kind: str, world_size: int) -> None:
    for drop_last in (False, True):
        ref = _reference(kind, world_size, drop_last)
        for rank, res in enumerate(results):
            for (impl, dl), snaps in res.items():
                if dl != drop_last:
                    continue
                assert len(snaps) == len(ref), f"{impl}: {len(snaps)} steps, reference {len(ref)}"
                for step, (got, want) in enumerate(zip(snaps, ref, strict=True)):
                    for i, (p, q) in enumerate(zip(got, want, strict=True)):
                        torch.testing.assert_close(
                            p,
                            q,
                            rtol=RTOL,
                            atol=ATOL,
                            msg=lambda m, impl=impl, s=step, i=i, r=rank, d=drop_last: (
                                f"{impl}, rank {r}, drop_last={d}, step {s}, parameter {i}: {m}"
                            ),
                        )


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_mlp_matches_one_process_on_the_full_batch(world_size):
    results = lk.launch(_train, world_size, args=("mlp", IMPLS, _dataset()), timeout=120)
    _check(results, "mlp", world_size)


@pytest.mark.parametrize("world_size", [2, 4])
def test_cnn_matches_one_process_on_the_full_batch(world_size):
    impls = IMPLS if world_size == 2 else ("bucketed",)
    results = lk.launch(_train, world_size, args=("cnn", impls, _dataset()), timeout=120)
    _check(results, "cnn", world_size)


def test_reference_differs_from_a_wrong_average():
    """The comparison can fail: gradients summed instead of averaged miss the reference."""
    good = _reference("mlp", 2, False)
    model = _model("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=2 * LR)  # = summing the two ranks' grads
    ds = _dataset()
    x, y = ds[[i for s in range(2) for i in list(DistributedSampler(ds, 2, s, seed=0))[:BATCH]]]
    F.cross_entropy(model(x), y).backward()
    opt.step()
    with pytest.raises(AssertionError):
        for p, q in zip(model.parameters(), good[0], strict=True):
            torch.testing.assert_close(p.detach(), q, rtol=RTOL, atol=ATOL)
