"""Unmodified PyTorch on labkit_shm: DistributedDataParallel reaches the parameters it reaches
over gloo, FSDP2's ``fully_shard`` those of a single-process reference, and object
collectives, subgroups, 2-D device meshes, DTensor and functional collectives work.
"""

from __future__ import annotations

import os

import pytest
import torch

import labkit as lk
from labkit.backends._shm import segment

STEPS = 5
DDP_TOL = 1e-6  # float32 gradients averaged in another order than gloo's
FSDP_TOL = 1e-6


@pytest.fixture(scope="module", autouse=True)
def no_leaked_segments():
    before = {f for f in os.listdir(segment.SHM_DIR) if f.startswith(segment.PREFIX)}
    yield
    after = {f for f in os.listdir(segment.SHM_DIR) if f.startswith(segment.PREFIX)}
    assert after - before == set(), "a labkit_shm segment was left in /dev/shm"


def _model():
    import torch.nn as nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 3)
    )


def _batches(world_size: int, steps: int):
    gen = torch.Generator().manual_seed(1)
    return [
        (
            torch.randn(4 * world_size, 10, generator=gen),
            torch.randn(4 * world_size, 3, generator=gen),
        )
        for _ in range(steps)
    ]


def _ddp_both(rank, world_size):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    gloo = dist.new_group(backend="gloo")
    params = {}
    for name, group in (("labkit_shm", None), ("gloo", gloo)):
        # Small buckets: several all-reduces per step, rebuilt after the first step.
        model = DDP(_model(), process_group=group, bucket_cap_mb=0.002)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for x, y in _batches(world_size, STEPS):
            xs, ys = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
            loss = torch.nn.functional.mse_loss(model(xs), ys)
            opt.zero_grad()
            loss.backward()
            opt.step()
        params[name] = [p.detach().clone() for p in model.parameters()]
        del model, opt
    return params


@pytest.mark.parametrize("world_size", [2, 3])
def test_ddp_trains_to_the_same_parameters_as_gloo(world_size):
    res = lk.launch(_ddp_both, world_size=world_size, backend="labkit_shm", timeout=120)
    for rank, params in enumerate(res):
        for p, q in zip(params["labkit_shm"], params["gloo"], strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=DDP_TOL, msg=f"rank {rank}")
        for p, q in zip(params["labkit_shm"], res[0]["labkit_shm"], strict=True):
            assert torch.equal(p, q), "labkit_shm replicas drifted apart"
    start = [p.detach() for p in _model().parameters()]
    moved = max((p - s).abs().max().item() for p, s in zip(res[0]["gloo"], start, strict=True))
    assert moved > 1e-2, "training did not change the parameters: the test would prove nothing"


def _fsdp(rank, world_size, steps):
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, ref = _model(), _model()
    mesh = init_device_mesh("cpu", (world_size,))  # over the default group: labkit_shm
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for x, y in _batches(world_size, steps):
        xs, ys = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        torch.nn.functional.mse_loss(model(xs), ys).backward()  # FSDP2 averages (ReduceOp.AVG)
        opt.step()
        opt.zero_grad()
        torch.nn.functional.mse_loss(ref(x), y).backward()  # one process, the whole batch
        ref_opt.step()
        ref_opt.zero_grad()
    return [p.full_tensor() for p in model.parameters()], [p.detach() for p in ref.parameters()]


def test_fsdp2_trains_to_the_single_process_reference():
    res = lk.launch(_fsdp, world_size=2, args=(3,), backend="labkit_shm", timeout=120)
    for rank, (sharded, reference) in enumerate(res):
        for p, q in zip(sharded, reference, strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=FSDP_TOL, msg=f"rank {rank}")


def _torch_apis(rank, world_size):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    objs = [None] * world_size
    dist.all_gather_object(objs, {"rank": rank})
    listed = [rank, "x"] if rank == 0 else [None, None]
    dist.broadcast_object_list(listed, 0)
    pair = dist.new_group([0, 1], backend="labkit_shm")  # a subgroup; ranks 2, 3 are not in it
    x = torch.full((3,), float(rank))
    if rank < 2:
        dist.all_reduce(x, group=pair)
    mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
    tp = torch.full((2,), float(rank))
    dist.all_reduce(tp, group=mesh.get_group("tp"))
    flat = init_device_mesh("cpu", (world_size,))
    d = distribute_tensor(torch.arange(8.0), flat, [Shard(0)])
    full = d.full_tensor()  # DTensor's functional all_gather, from C++
    replicated = d.redistribute(flat, [Replicate()]).to_local()
    summed = funcol.all_reduce(torch.full((2,), float(rank)), "sum", dist.group.WORLD)
    return objs, listed, x, tp, full, replicated, summed


def test_object_collectives_subgroups_meshes_and_dtensor_work():
    n = 4
    for rank, res in enumerate(lk.launch(_torch_apis, world_size=n, backend="labkit_shm")):
        objs, listed, x, tp, full, replicated, summed = res
        assert objs == [{"rank": r} for r in range(n)] and listed == [0, "x"]
        assert x.tolist() == ([1.0] * 3 if rank < 2 else [float(rank)] * 3)  # 0 + 1, or unchanged
        pair = rank - rank % 2  # the tp dimension of the (2, 2) mesh: ranks {0, 1}, {2, 3}
        assert tp.tolist() == [float(pair + pair + 1)] * 2
        assert full.tolist() == replicated.tolist() == list(range(8))
        assert summed.tolist() == [float(sum(range(n)))] * 2
