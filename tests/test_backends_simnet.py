"""Tests for labkit/backends/simnet.py: gloo's results, no faster than the cost model says.

Durations are compared only with generous bounds: each operation must take at least the
model's time (the backend guarantees it) and not wildly more (a second of slack).
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.backends import simnet
from labkit.costmodel import Network, predict

FAST = Network(latency_us=1.0, bandwidth_gbps=100.0, name="fast")  # delays of microseconds
# β-dominated and slow: 1 ms + 100 ns/byte. An all-gather of 400 KB on 2 ranks costs
# α + 200 KB·β = 21 ms only if its n is counted as nccl-tests does (the gathered output);
# counting the 200 KB input would give 11 ms and fail the lower bound.
SLOW = Network(latency_us=1000.0, bandwidth_gbps=0.01, name="slow")
SLACK_S = 1.0  # a shared 2-core machine can stall a rank for hundreds of ms


def _every_op(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(12, generator=gen)
    out = {}
    t = x.clone()
    dist.all_reduce(t)
    out["all_reduce"] = t
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t
    t = x.clone()
    dist.broadcast(t, src=1)
    out["broadcast"] = t
    gathered = torch.empty(12 * world_size)
    dist.all_gather_into_tensor(gathered, x)
    out["all_gather_into_tensor"] = gathered
    parts = [torch.empty(12) for _ in range(world_size)]
    dist.all_gather(parts, x)
    out["all_gather"] = torch.cat(parts)
    shard = torch.empty(12 // world_size)
    dist.reduce_scatter_tensor(shard, x)
    out["reduce_scatter_tensor"] = shard
    a2a = torch.empty(12)
    dist.all_to_all_single(a2a, x)
    out["all_to_all_single"] = a2a
    peer = (rank + 1) % world_size
    got = torch.empty(12)
    ops = [dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, got, (rank - 1) % world_size)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    out["ring_exchange"] = got
    dist.barrier()
    return out


def test_results_identical_to_the_inner_backend() -> None:
    ref = lk.launch(_every_op, 3, backend="gloo", device="cpu", timeout=60)
    sim = lk.launch(_every_op, 3, backend=simnet.spec(FAST), device="cpu", timeout=60)
    for r, (want, got) in enumerate(zip(ref, sim, strict=True)):
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (r, name)


def _timed(rank: int, world_size: int, sizes: dict[str, int]) -> dict:
    out: dict = {"group": type(dist.group.WORLD).__name__, "backend": dist.get_backend()}
    buf = torch.ones(sizes["all_reduce"] // 4)
    dist.barrier()
    start = time.perf_counter()
    dist.all_reduce(buf)
    out["all_reduce"] = time.perf_counter() - start
    inp = torch.ones(sizes["all_gather"] // 4 // world_size)
    gathered = torch.empty(sizes["all_gather"] // 4)
    dist.barrier()
    start = time.perf_counter()
    work = dist.all_gather_into_tensor(gathered, inp, async_op=True)
    work.get_future().wait()  # the future, not wait(): DDP's path
    out["all_gather"] = time.perf_counter() - start
    msg = torch.ones(sizes["p2p"] // 4)
    dist.barrier()
    start = time.perf_counter()
    if rank == 0:
        dist.send(msg, 1)
    elif rank == 1:
        dist.recv(msg, 0)
    out["p2p"] = time.perf_counter() - start
    return out


def test_operations_take_at_least_the_predicted_time() -> None:
    sizes = {"all_reduce": 1 << 20, "all_gather": 400_000, "p2p": 200_000}
    out = lk.launch(_timed, 2, backend=simnet.spec(SLOW), args=(sizes,), timeout=60)
    for rank, row in enumerate(out):
        assert row["group"] == "SimulatedNetworkProcessGroup"
        assert row["backend"] == "labkit_simnet_gloo"
        for op, n in sizes.items():
            if op == "p2p" and rank > 1:
                continue
            want = predict(op, n, 2, SLOW)
            assert want <= row[op] < want + SLACK_S, (rank, op, row[op], want)


def test_algorithm_choice_changes_the_delay() -> None:
    # recursive doubling on 4 ranks: 2α; ring: 6α. With α = 30 ms the ring takes ≥ 180 ms.
    net = Network(latency_us=30_000.0, bandwidth_gbps=10.0)

    def run(rank: int, world_size: int) -> float:
        t = torch.ones(4)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        return time.perf_counter() - start

    backend = simnet.spec(net, algorithms={"all_reduce": "recursive_doubling"})
    rd = max(lk.launch(run, 4, backend=backend, timeout=60))
    ring = max(lk.launch(run, 4, backend=simnet.spec(net), timeout=60))
    assert 2 * net.alpha <= rd < 2 * net.alpha + SLACK_S
    assert 6 * net.alpha <= ring < 6 * net.alpha + SLACK_S


def test_registered_by_name_with_network_from_env(monkeypatch) -> None:
    monkeypatch.setenv("LABKIT_SIMNET_NETWORK", "100Gb-IB")

    def run(rank: int, world_size: int) -> tuple:
        pg = dist.group.WORLD
        t = torch.full((3,), float(rank))
        dist.all_reduce(t)
        return dist.get_backend(), pg.network, t.tolist()

    out = lk.launch(run, 2, backend="labkit_simnet", timeout=60)
    assert out == [("labkit_simnet", Network.preset("100Gb-IB"), [1.0, 1.0, 1.0])] * 2


def test_ddp_trains_as_on_gloo() -> None:
    def train(rank: int, world_size: int) -> list[torch.Tensor]:
        from torch.nn.parallel import DistributedDataParallel as DDP

        torch.manual_seed(0)
        model = DDP(torch.nn.Linear(4, 2))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(8, 4, generator=gen)).square().sum().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]

    ref = lk.launch(train, 2, backend="gloo", timeout=90)
    sim = lk.launch(train, 2, backend=simnet.spec(FAST), timeout=90)
    for want, got in zip(ref[0] + ref[1], sim[0] + sim[1], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_network_from_env_and_spec_errors(monkeypatch) -> None:
    monkeypatch.delenv("LABKIT_SIMNET_NETWORK", raising=False)
    assert simnet.network_from_env() == Network.preset("10GbE")
    assert simnet.network_from_env("nvlink") == Network.preset("NVLink")
    custom = simnet.network_from_env("20, 1.25")
    assert (custom.latency_us, custom.bandwidth_gbps) == (20.0, 1.25)
    with pytest.raises(ValueError, match="known: loopback"):
        simnet.network_from_env("token ring")
    with pytest.raises(ValueError, match="latency_us"):
        simnet.network_from_env("fast,slow")
    with pytest.raises(ValueError, match="no algorithm 'butterfly'"):
        simnet.spec(FAST, algorithms={"all_reduce": "butterfly"})
    with pytest.raises(ValueError, match="lk.Network"):
        simnet.spec(3.0)
    s = simnet.spec("NVLink", inner="gloo")
    assert s.name == "labkit_simnet_gloo" and s.devices == ("cpu",) and s.extended_api
