"""labkit.parallel.ddp: bucket assignment, all-reduces counted per step, overlap, ``no_sync``,
and parameters without gradients.

Counting uses the recording backend (``backend="labkit_record"``): every all-reduce a rank
issues is a row of ``labkit.backends.recording.records()``.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import labkit as lk
from labkit.parallel.ddp import assign_buckets

MB = 1024 * 1024
TOL = dict(rtol=1e-6, atol=1e-7)  # same gradients summed in the same order: measured equal


def _mlp() -> nn.Module:
    # net.0: 64→32, net.2: 32→16, net.4: 16→10 (weights 8192, 2048, 640 bytes; biases 128,
    # 64, 40 bytes)
    return lk.models.MLP(hidden=(32, 16), seed=0)


# --- bucket assignment: no processes ---------------------------------------------------------


def test_buckets_walk_parameters_in_reverse_registration_order():
    assert assign_buckets(_mlp(), bucket_cap_mb=1.0) == [
        ["net.4.bias", "net.4.weight", "net.2.bias", "net.2.weight", "net.0.bias", "net.0.weight"]
    ]


def test_a_bucket_closes_when_the_next_parameter_would_exceed_the_cap():
    # 40 + 640 = 680 ≤ 700; + 64 > 700 closes; 64 + 2048 > 700; each larger one alone.
    assert assign_buckets(_mlp(), bucket_cap_mb=700 / MB) == [
        ["net.4.bias", "net.4.weight"],
        ["net.2.bias"],
        ["net.2.weight"],
        ["net.0.bias"],
        ["net.0.weight"],
    ]
    # Exactly at the cap still fits: 40 + 640 + 64 + 2048 = 2792.
    assert assign_buckets(_mlp(), bucket_cap_mb=2792 / MB)[0][-1] == "net.2.weight"
    assert assign_buckets(_mlp(), bucket_cap_mb=2791 / MB)[0][-1] == "net.2.bias"


def test_a_parameter_larger_than_the_cap_is_a_bucket_of_its_own():
    buckets = assign_buckets(_mlp(), bucket_cap_mb=1 / MB)
    assert buckets == [[n] for n, _ in reversed(list(_mlp().named_parameters()))]


def test_frozen_parameters_and_dtype_changes():
    model = _mlp()
    model.net[2].requires_grad_(False)
    model.net[0].bias.data = model.net[0].bias.data.double()
    assert assign_buckets(model, bucket_cap_mb=1.0) == [
        ["net.4.bias", "net.4.weight"],
        ["net.0.bias"],
        ["net.0.weight"],
    ]


def test_cap_must_be_positive():
    with pytest.raises(ValueError, match="bucket_cap_mb must be > 0"):
        assign_buckets(_mlp(), bucket_cap_mb=0)


# --- collectives counted with the recording backend -----------------------------------------


def _batch(rank: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * seed + rank)
    return torch.randn(6, 64, generator=g), torch.randint(0, 10, (6,), generator=g)


def _all_reduces() -> list:
    from labkit.backends import recording

    return [r for r in recording.records() if r.op == "all_reduce"]


def _count(rank: int, world_size: int, cap_mb: float) -> dict:
    from labkit.backends import recording

    out = {}
    for name in ("naive", "bucketed"):
        model = _mlp()
        if name == "naive":
            wrapped = lk.parallel.ddp.DataParallelNaive(model)
        else:
            wrapped = lk.parallel.ddp.DataParallelBucketed(model, bucket_cap_mb=cap_mb)
            out["buckets"] = wrapped.buckets
        steps = []
        for step in range(3):
            recording.clear()
            x, y = _batch(rank, step)
            model.zero_grad()
            F.cross_entropy(wrapped(x), y).backward()
            steps.append([r.n_bytes for r in _all_reduces()])
        out[name] = steps
    return out


def test_naive_issues_one_all_reduce_per_parameter_and_bucketed_one_per_bucket():
    cap_mb = 700 / MB
    res = lk.launch(_count, 2, backend="labkit_record", args=(cap_mb,), timeout=120)
    sizes = {n: p.numel() * 4 for n, p in _mlp().named_parameters()}
    expected_buckets = assign_buckets(_mlp(), cap_mb)
    for out in res:
        assert out["buckets"] == expected_buckets
        for step in out["naive"]:  # registration order, one per parameter
            assert step == list(sizes.values())
        for step in out["bucketed"]:  # one per bucket, in bucket order, of the bucket's size
            assert step == [sum(sizes[n] for n in b) for b in expected_buckets]


def _overlap(rank: int, world_size: int, overlap: bool) -> tuple[int, int, int]:
    """(first all-reduce start, last gradient accumulated, number of all-reduces)."""
    from labkit.backends import recording

    model = lk.models.MLP(hidden=(256, 256, 256), seed=0)
    wrapped = lk.parallel.ddp.DataParallelBucketed(model, bucket_cap_mb=0.3, overlap=overlap)
    last = [0]

    def stamp(p: torch.Tensor) -> None:
        last[0] = max(last[0], lk.trace.clock_ns())

    for p in model.parameters():  # registered after the wrapper's hooks: run after them
        p.register_post_accumulate_grad_hook(stamp)
    x, y = _batch(rank)
    recording.clear()
    F.cross_entropy(wrapped(x), y).backward()
    ars = _all_reduces()
    return ars[0].start_ns, last[0], len(ars)


@pytest.mark.parametrize("overlap", [True, False])
def test_overlap_starts_the_first_bucket_before_backward_ends(overlap):
    for first_start, last_grad, n in lk.launch(
        _overlap, 2, backend="labkit_record", args=(overlap,), timeout=120
    ):
        assert n > 1
        assert (first_start < last_grad) == overlap


def _no_sync(rank: int, world_size: int, k: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from labkit.backends import recording

    out = {}
    for name in ("bucketed", "torch"):
        model = _mlp()
        if name == "bucketed":
            wrapped = lk.parallel.ddp.DataParallelBucketed(model, bucket_cap_mb=700 / MB)
            out["n_buckets"] = len(wrapped.buckets)
        else:
            wrapped = DistributedDataParallel(model)
        for step in range(2):  # torch DDP rebuilds its buckets after its first step
            recording.clear()
            model.zero_grad(set_to_none=step == 0)
            for micro in range(k):
                x, y = _batch(rank, 10 * step + micro)
                if micro < k - 1:
                    with wrapped.no_sync():
                        F.cross_entropy(wrapped(x), y).backward()
                else:
                    F.cross_entropy(wrapped(x), y).backward()
            out[f"{name}_count_{step}"] = len(_all_reduces())
        out[f"{name}_grads"] = [p.grad.clone() for p in model.parameters()]
    return out


def test_no_sync_accumulates_locally_and_reduces_once_per_k_micro_steps():
    k = 4
    for out in lk.launch(_no_sync, 2, backend="labkit_record", args=(k,), timeout=120):
        assert out["n_buckets"] == 5
        assert out["bucketed_count_0"] == out["bucketed_count_1"] == out["n_buckets"]
        for got, want in zip(out["bucketed_grads"], out["torch_grads"], strict=True):
            torch.testing.assert_close(got, want, **TOL)


# --- parameters without gradients ------------------------------------------------------------


class _Branchy(nn.Module):
    """A frozen layer, a layer no rank uses, and a branch only rank 0 uses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(64, 16)
        self.frozen = nn.Linear(16, 16).requires_grad_(False)
        self.branch = nn.Linear(16, 16)
        self.never = nn.Linear(16, 16)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor, use_branch: bool) -> torch.Tensor:
        h = self.frozen(self.inp(x)).relu()
        return self.head(self.branch(h) if use_branch else h)


def _unused(rank: int, world_size: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    out = {}
    for name in ("naive", "bucketed", "torch"):
        model = _Branchy()
        if name == "naive":
            wrapped = lk.parallel.ddp.DataParallelNaive(model)
        elif name == "bucketed":
            wrapped = lk.parallel.ddp.DataParallelBucketed(model, bucket_cap_mb=1e-3)
            out["buckets"] = wrapped.buckets
        else:
            wrapped = DistributedDataParallel(model, find_unused_parameters=True)
        for step in range(2):
            model.zero_grad()
            x, y = _batch(rank, step)
            F.cross_entropy(wrapped(x, use_branch=rank == 0), y).backward()
        out[name] = {n: p.grad for n, p in model.named_parameters()}
    return out


def test_frozen_and_unused_parameters():
    for out in lk.launch(_unused, 2, timeout=120):
        assert not any("frozen" in n for b in out["buckets"] for n in b)
        for name in ("naive", "bucketed"):
            grads = out[name]
            assert grads["frozen.weight"] is None
            assert torch.count_nonzero(grads["never.weight"]) == 0  # no rank used it: zeros
            for n, want in out["torch"].items():  # rank 1 gets rank 0's branch gradient / 2
                if want is not None:
                    torch.testing.assert_close(grads[n], want, **TOL, msg=f"{name} {n}")


# --- the group argument ----------------------------------------------------------------------


def _in_subgroup(rank: int, world_size: int) -> dict:
    import torch.distributed as dist

    group = dist.new_group([1, 2])  # every rank calls new_group; rank 0 is not in it
    if rank == 0:
        return {}
    out = {}
    for name in ("naive", "bucketed"):
        model = lk.models.MLP(hidden=(16,), seed=rank)  # different on every rank...
        model.register_buffer("steps", torch.tensor([float(rank)]))
        if name == "naive":  # ...until the group's first rank (global rank 1) broadcasts
            wrapped = lk.parallel.ddp.DataParallelNaive(model, group=group)
        else:
            wrapped = lk.parallel.ddp.DataParallelBucketed(model, group=group)
        start = [t.clone() for t in [*model.parameters(), *model.buffers()]]
        x, y = _batch(rank)
        F.cross_entropy(wrapped(x), y).backward()
        local = lk.models.MLP(hidden=(16,), seed=1)  # rank 1's replica, this rank's data
        F.cross_entropy(local(x), y).backward()
        out[name] = {
            "start": start,
            "grads": [p.grad for p in model.parameters()],
            "local": [p.grad for p in local.parameters()],
        }
    return out


def test_a_subgroup_broadcasts_from_its_first_rank_and_averages_within():
    _, one, two = lk.launch(_in_subgroup, 3, timeout=120)
    for name in ("naive", "bucketed"):
        for p, q in zip(one[name]["start"], two[name]["start"], strict=True):
            torch.testing.assert_close(p, q, rtol=0, atol=0)  # parameters and buffers
        assert one[name]["start"][-1].item() == 1.0  # global rank 1's buffer
        for g1, g2, l1, l2 in zip(
            one[name]["grads"],
            two[name]["grads"],
            one[name]["local"],
            two[name]["local"],
            strict=True,
        ):
            torch.testing.assert_close(g1, g2, **TOL)
            torch.testing.assert_close(g1, (l1 + l2) / 2, rtol=1e-5, atol=1e-6)
