"""Tests for labkit/parallel/accumulate.py: accumulation with no_sync equals the large batch.

Each case trains on 2 ranks with k micro-batches per rank and compares the parameters after
every step with one process taking the whole global batch; all-reduces are counted with the
recording backend. Run for PyTorch's DDP and for labkit's DataParallelBucketed.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.distributed as dist
from torch import nn

import labkit as lk
from labkit.parallel.accumulate import (
    accumulation_step,
    global_token_count,
    split_micro_batches,
    sync_context,
    token_mean_loss,
)

WORLD_SIZE = 2
K = 4  # micro-batches per rank and step
MICRO = 8  # samples per micro-batch
STEPS = 3
BUCKET_MB = 1024 / 2**20  # 1 KB buckets: MLP(64, (32,), 10) splits into 2 buckets
LR = 0.1
MAX_NORM = 0.05  # small enough that every step clips (asserted)
TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32, summation order differs between the two runs
WRAPPERS = ["torch", "labkit_bucketed"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models in this process: one thread is faster than two on a shared 2-core CPU."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model() -> nn.Module:
    return lk.models.MLP(64, (32,), 10, seed=0)


def _global_batches(world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    n = world_size * K * MICRO
    x = torch.randn(STEPS, n, 64, generator=gen)
    y = torch.randint(0, 10, (STEPS, n), generator=gen)
    return x, y


def _local(x: torch.Tensor, rank: int) -> torch.Tensor:
    return x[rank * K * MICRO : (rank + 1) * K * MICRO]  # this rank's share of one step


def _wrap(kind: str, model: nn.Module) -> nn.Module:
    if kind == "torch":
        return nn.parallel.DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
    from labkit.parallel.ddp import DataParallelBucketed

    return DataParallelBucketed(model, bucket_cap_mb=BUCKET_MB)


def broken_step(model, optimizer, micro_batches, loss_fn, max_norm=None):
    """The loop as often written: zero_grad before every micro-batch (keeps only the last)."""
    for x, y in micro_batches:
        optimizer.zero_grad()
        loss = loss_fn(model(x), y) / len(micro_batches)
        loss.backward()
    if max_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()


def without_no_sync(model, optimizer, micro_batches, loss_fn, max_norm=None):
    """Correct arithmetic, but every backward all-reduces (k rounds per step)."""
    optimizer.zero_grad()
    for x, y in micro_batches:
        (loss_fn(model(x), y) / len(micro_batches)).backward()
    if max_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()


LOOPS = {"correct": accumulation_step, "broken": broken_step, "no_no_sync": without_no_sync}


def _train(rank: int, world_size: int, kind: str, max_norm: float | None) -> dict:
    from labkit.backends import recording

    x_all, y_all = _global_batches(world_size)
    out = {}
    for name, step_fn in LOOPS.items():
        model = _wrap(kind, _model())
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        params, reduces = [], []
        for s in range(STEPS):
            mbs = split_micro_batches(_local(x_all[s], rank), _local(y_all[s], rank), K)
            recording.clear()
            step_fn(model, opt, mbs, nn.functional.cross_entropy, max_norm=max_norm)
            reduces.append(sum(r.op == "all_reduce" for r in recording.records()))
            params.append(nn.utils.parameters_to_vector(model.parameters()).detach().clone())
        recording.clear()  # one plain step (one micro-batch): the all-reduces of one round
        model.zero_grad()
        nn.functional.cross_entropy(
            model(_local(x_all[0], rank)), _local(y_all[0], rank)
        ).backward()
        out[name] = {"params": params, "reduces": reduces}
        out["round"] = sum(r.op == "all_reduce" for r in recording.records())
    dist.barrier()
    return out


def _reference(world_size: int, last_micro_only: bool, max_norm: float | None) -> dict:
    """One process, the whole global batch per step (or, for the broken loop, the union of
    every rank's last micro-batch with its loss divided by k)."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    x_all, y_all = _global_batches(world_size)
    params, norms = [], []
    for s in range(STEPS):
        x, y = x_all[s], y_all[s]
        if last_micro_only:
            keep = torch.cat(
                [torch.arange(MICRO) + r * K * MICRO + (K - 1) * MICRO for r in range(world_size)]
            )
            x, y = x[keep], y[keep]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        (loss / K if last_micro_only else loss).backward()
        if max_norm is not None:
            norms.append(nn.utils.clip_grad_norm_(model.parameters(), max_norm).item())
        opt.step()
        params.append(nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    return {"params": params, "norms": norms}


def _require(kind: str) -> None:
    if kind == "labkit_bucketed" and importlib.util.find_spec("labkit.parallel.ddp") is None:
        pytest.skip("labkit/parallel/ddp.py (DataParallelBucketed) is not in this checkout yet")


@pytest.mark.parametrize("max_norm", [None, MAX_NORM], ids=["no_clip", "clip"])
@pytest.mark.parametrize("kind", WRAPPERS)
def test_accumulation_with_no_sync_equals_the_large_batch(kind: str, max_norm) -> None:
    _require(kind)
    results = lk.launch(
        _train, WORLD_SIZE, backend="labkit_record", args=(kind, max_norm), timeout=120
    )
    want = _reference(WORLD_SIZE, last_micro_only=False, max_norm=max_norm)
    if max_norm is not None:
        assert min(want["norms"]) > max_norm  # clipping really changed every step
    for rank, got in enumerate(results):
        for s in range(STEPS):
            torch.testing.assert_close(got["correct"]["params"][s], want["params"][s], **TOL)
            # Same arithmetic without no_sync: same parameters, k times the all-reduces.
            torch.testing.assert_close(got["no_no_sync"]["params"][s], want["params"][s], **TOL)
            # The broken loop differs from the large batch ...
            diff = (got["broken"]["params"][s] - want["params"][s]).abs().max().item()
            assert diff > 1e-4, f"rank {rank} step {s}: broken loop within {diff:.1e}"
        # ... and is exactly a step on each rank's last micro-batch (when nothing clips).
        if max_norm is None:
            broken = _reference(WORLD_SIZE, last_micro_only=True, max_norm=None)
            for s in range(STEPS):
                torch.testing.assert_close(got["broken"]["params"][s], broken["params"][s], **TOL)


@pytest.mark.parametrize("kind", WRAPPERS)
def test_one_all_reduce_round_per_optimizer_step(kind: str) -> None:
    _require(kind)
    results = lk.launch(_train, WORLD_SIZE, backend="labkit_record", args=(kind, None))
    for got in results:
        one_round = got["round"]
        assert one_round >= 2, "several buckets, so a round is more than one all-reduce"
        # Step 0 of PyTorch's DDP all-reduces one bucket of everything, then rebuilds buckets.
        assert got["correct"]["reduces"][1:] == [one_round] * (STEPS - 1)
        assert got["no_no_sync"]["reduces"][1:] == [K * one_round] * (STEPS - 1)
        assert got["broken"]["reduces"][1:] == [K * one_round] * (STEPS - 1)


def _clip_order(rank: int, world_size: int, before_allreduce: bool) -> torch.Tensor:
    x_all, y_all = _global_batches(world_size)
    model = nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for s in range(STEPS):
        x, y = _local(x_all[s], rank), _local(y_all[s], rank)
        opt.zero_grad()
        if before_allreduce:  # clip this rank's gradient, then average by hand
            with model.no_sync():
                nn.functional.cross_entropy(model(x), y).backward()
            nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= world_size
        else:
            nn.functional.cross_entropy(model(x), y).backward()  # DDP averages here
            nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
    return nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def _clip_both(rank: int, world_size: int) -> list[torch.Tensor]:
    return [_clip_order(rank, world_size, b) for b in (False, True)]


def test_clip_after_the_all_reduce_equals_one_process_and_before_differs() -> None:
    results = lk.launch(_clip_both, WORLD_SIZE, timeout=120)
    want = _reference(WORLD_SIZE, last_micro_only=False, max_norm=MAX_NORM)
    assert min(want["norms"]) > MAX_NORM
    for after, before in results:
        torch.testing.assert_close(after, want["params"][-1], **TOL)
        assert (before - want["params"][-1]).abs().max().item() > 1e-4


def test_accumulation_on_one_process_equals_the_large_batch() -> None:
    x_all, y_all = _global_batches(1)
    model, ref = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    for s in range(STEPS):
        stats = accumulation_step(
            model, opt, split_micro_batches(x_all[s], y_all[s], K), nn.functional.cross_entropy
        )
        ref_opt.zero_grad()
        loss = nn.functional.cross_entropy(ref(x_all[s]), y_all[s])
        loss.backward()
        ref_opt.step()
        assert stats["loss"] == pytest.approx(loss.item(), rel=1e-5)
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL)


def test_unequal_micro_batches_are_weighted_by_size() -> None:
    x, labels = (t[0][:10] for t in _global_batches(1))
    y = nn.functional.one_hot(labels, 10).float()
    mbs = split_micro_batches(x, y, 3)
    assert [len(m[0]) for m in mbs] == [4, 3, 3]  # 1/k would weight 4 samples like 3
    model, ref = _model(), _model()
    accumulation_step(model, torch.optim.SGD(model.parameters(), lr=LR), mbs, nn.MSELoss())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)
    nn.MSELoss()(ref(x), y).backward()
    ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, **TOL)


def test_arguments_are_checked() -> None:
    x, y = torch.zeros(4, 64), torch.zeros(4, dtype=torch.long)
    with pytest.raises(ValueError, match="1 <= k <= batch size"):
        split_micro_batches(x, y, 5)
    with pytest.raises(ValueError, match="differ in length"):
        split_micro_batches(x, y[:3], 2)
    model = _model()
    with pytest.raises(ValueError, match="at least one micro-batch"):
        accumulation_step(model, torch.optim.SGD(model.parameters(), lr=LR), [], nn.MSELoss())


def test_sync_context_uses_no_sync_only_when_not_syncing() -> None:
    class Wrapped(nn.Module):
        calls = 0

        def no_sync(self):
            Wrapped.calls += 1
            return torch.no_grad()  # any context manager

    w = Wrapped()
    assert type(sync_context(w, sync=True)).__name__ == "nullcontext"
    assert isinstance(sync_context(w, sync=False), torch.no_grad) and Wrapped.calls == 1
    assert type(sync_context(nn.Linear(1, 1), sync=False)).__name__ == "nullcontext"


TOKENS = 32  # positions per rank; rank r keeps VALID[r] of them, the rest is padding (-100)
VALID = (4, 32)


def _padded_batch(world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(world_size * TOKENS, 64, generator=gen)
    y = torch.randint(0, 10, (world_size * TOKENS,), generator=gen)
    for r in range(world_size):
        y[r * TOKENS + VALID[r] : (r + 1) * TOKENS] = -100  # cross_entropy's ignore_index
    return x, y


def _token_grads(rank: int, world_size: int, weighting: str) -> dict[str, torch.Tensor]:
    x, y = (_local_tokens(t, rank) for t in _padded_batch(world_size))
    model = nn.parallel.DistributedDataParallel(_model())
    out = model(x)
    if weighting == "rank_mean":  # each rank's mean over its own tokens; DDP averages those
        loss = nn.functional.cross_entropy(out, y)
    else:
        n_global = global_token_count(int((y != -100).sum()))
        loss_sum = nn.functional.cross_entropy(out, y, reduction="sum")
        loss = token_mean_loss(loss_sum, n_global, world_size)
    loss.backward()
    return {n: q.grad.clone() for n, q in model.module.named_parameters()}


def _local_tokens(t: torch.Tensor, rank: int) -> torch.Tensor:
    return t[rank * TOKENS : (rank + 1) * TOKENS]


def _one_process_grads(weighting: str) -> dict[str, torch.Tensor]:
    """One process: the per-token mean over all ranks' tokens, or the mean of rank means."""
    x, y = _padded_batch(WORLD_SIZE)
    model = _model()
    if weighting == "token_mean":
        loss = nn.functional.cross_entropy(model(x), y)  # mean over all valid tokens
    else:
        loss = (
            sum(
                nn.functional.cross_entropy(model(_local_tokens(x, r)), _local_tokens(y, r))
                for r in range(WORLD_SIZE)
            )
            / WORLD_SIZE
        )
    loss.backward()
    return {n: q.grad for n, q in model.named_parameters()}


def _both_weightings(rank: int, world_size: int) -> dict[str, dict[str, torch.Tensor]]:
    return {w: _token_grads(rank, world_size, w) for w in ("rank_mean", "token_mean")}


def test_token_weighted_loss_equals_one_process_and_rank_means_do_not() -> None:
    results = lk.launch(_both_weightings, WORLD_SIZE, timeout=120)
    full = _one_process_grads("token_mean")
    mean_of_means = _one_process_grads("rank_mean")
    for got in results:
        assert got["token_mean"].keys() == full.keys()
        for name in full:  # every gradient
            torch.testing.assert_close(got["token_mean"][name], full[name], **TOL)
            torch.testing.assert_close(got["rank_mean"][name], mean_of_means[name], **TOL)
        worst = max((got["rank_mean"][n] - full[n]).abs().max().item() for n in full)
        assert worst > 1e-3, worst  # 4 vs 32 tokens: the rank means weight tokens 8:1


def test_token_mean_loss_arithmetic() -> None:
    loss_sum = torch.tensor(6.0)
    assert token_mean_loss(loss_sum, 12, 2).item() == pytest.approx(1.0)  # 2 · 6 / 12
    with pytest.raises(ValueError, match="n_global > 0"):
        token_mean_loss(loss_sum, 0, 2)


def _scaled_accumulation(rank: int, world_size: int) -> dict:
    from labkit.precision import autocast

    x_all, y_all = _global_batches(world_size)
    model = nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24, growth_interval=2)

    def loss_fn(out, y):
        return nn.functional.cross_entropy(out.float(), y)

    class Fp16(nn.Module):  # the forward under fp16 autocast; no_sync is DDP's
        def forward(self, x):
            with autocast("fp16", "cpu"):
                return model(x)

        def no_sync(self):
            return model.no_sync()

    scales, skipped = [], []
    for s in range(STEPS + 3):
        before = nn.utils.parameters_to_vector(model.parameters()).detach().clone()
        mbs = split_micro_batches(_local(x_all[s % STEPS], rank), _local(y_all[s % STEPS], rank), K)
        scales.append(scaler.get_scale())
        accumulation_step(Fp16(), opt, mbs, loss_fn, max_norm=1e6, scaler=scaler)
        after = nn.utils.parameters_to_vector(model.parameters()).detach()
        skipped.append(torch.equal(before, after))
    scales.append(scaler.get_scale())
    return {"scales": scales, "skipped": skipped, "params": after.clone()}


def test_accumulation_with_a_grad_scaler_skips_overflows_on_every_rank() -> None:
    from labkit.precision import next_loss_scale

    results = lk.launch(_scaled_accumulation, WORLD_SIZE, timeout=120)
    got = results[0]
    assert torch.equal(got["params"], results[1]["params"])  # the ranks agree, skips included
    scale, clean = got["scales"][0], 0
    for s, skipped in enumerate(got["skipped"]):
        scale, clean = next_loss_scale(scale, clean, skipped, growth_interval=2)
        assert got["scales"][s + 1] == scale, (s, got["scales"])
    assert any(got["skipped"]) and not all(got["skipped"])
