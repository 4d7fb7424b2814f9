"""Exercises of notebooks/07_ddp_buckets_and_overlap.ipynb.

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb.

``07_bf16_compress_hook``: write a DDP communication hook that all-reduces each bucket in
bfloat16 — half the bytes of float32, with float32's exponent range (so no loss scaling is
needed, unlike float16). The checker registers it with ``DistributedDataParallel`` on 2
ranks over the recording backend, on a simulated link whose every all-reduce takes at least
``LINK_LATENCY_US`` × 2 (``lk.backends.simnet``), and checks, for several steps: every gradient
equals the average DDP computes without a hook to bfloat16 precision, every all-reduce the
hook issued was in bfloat16, the bytes sent per step are half the float32 buckets', and the
hook **returns while its all-reduce is still in flight** — a hook that waits for the
all-reduce (a blocking ``dist.all_reduce``, or ``.wait()``) before returning a completed future
gives the same numbers but stalls backward on every bucket, so nothing overlaps (Li et al.
2020, §3.2.3, overlapping computation with communication).

No ``from __future__ import annotations`` here: DDP's ``register_comm_hook`` inspects the
hook's ``bucket`` annotation and accepts only the class ``dist.GradBucket`` itself.
"""

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from labkit.costmodel import Network, predict
from labkit.exercises import ExerciseFailed, exercise
from labkit.exercises._failures import first_cause
from labkit.launcher import RankError, launch

WORLD_SIZE = 2
STEPS = 3
TIMEOUT_S = 60.0
# bfloat16 keeps 8 significant bits (~0.4% per rounding); ranks' gradients can cancel, so
# the error is measured against the whole tensor's size, not element by element.
REL_TOL = 2e-2
# The simulated link: each all-reduce completes no earlier than the α-β model's time after it
# is issued (2(p-1)·α = 50 ms for a ring of p = 2); an asynchronous hook returns in well under
# a millisecond, a hook that waits returns after that time.
LINK_LATENCY_US = 25_000.0
IN_FLIGHT_MIN = 0.5  # fraction of hook calls that must return with the all-reduce in flight

PROMPT = """Write `my_bf16_hook(process_group, bucket)`: the communication hook DDP calls with
each bucket of gradients. Take `bucket.buffer()` (a flat float32 tensor), cast it to
bfloat16, divide by the group's size, all-reduce it asynchronously
(`dist.all_reduce(t, group=..., async_op=True).get_future()`), and return a future that,
when the all-reduce is done, copies the averaged values back into the float32 buffer and
returns that buffer (`fut.then(...)`), without waiting for it: backward goes on while the
all-reduce is in flight. `process_group` is None for the default group."""


def bfloat16_compress_hook(
    process_group: dist.ProcessGroup | None, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """All-reduce a DDP bucket in bfloat16 and return the float32 average.

    Reference solution of exercise ``07_bf16_compress_hook``; the same algorithm as
    ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook``
    (the DDP comm-hook interface: Li et al. 2020 and torch's "DDP Communication Hooks" docs),
    which DDP refuses without CUDA/NCCL — by its name, so this one has another.

    Args:
        process_group: the group to average over (the hook's state; None: the default group).
        bucket: the bucket DDP hands over (``bucket.buffer()``: its flat gradients).

    Returns:
        A future holding the bucket's buffer, overwritten with the average over ranks.
    """
    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(dist.get_world_size(group))
    fut = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(fut: torch.futures.Future) -> torch.Tensor:
        buffer.copy_(fut.value()[0])
        return buffer

    return fut.then(decompress)


def _model() -> torch.nn.Module:
    gen = torch.Generator().manual_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    return model


def _timed(hook: Callable, calls: list[tuple[float, bool]]) -> Callable:
    """``hook``, recording for each call its duration and whether its future was already done."""

    def timed_hook(state, bucket):  # unannotated: DDP checks annotations only when present
        start = time.perf_counter()
        fut = hook(state, bucket)
        calls.append((time.perf_counter() - start, bool(fut.done())))
        return fut

    return timed_hook


def _run(rank: int, world_size: int, hook: Callable | None) -> dict[str, Any]:
    from labkit.backends import recording

    model = _model()
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.001)  # 2+ buckets
    calls: list[tuple[float, bool]] = []
    if hook is not None:
        ddp.register_comm_hook(None, _timed(hook, calls))
    grads, sent = [], []
    for step in range(STEPS):
        gen = torch.Generator().manual_seed(100 * step + rank)  # each rank its own batch
        x = torch.randn(8, 16, generator=gen)
        recording.clear()
        ddp(x).square().mean().backward()
        sent.append([(r.op, r.n_bytes, r.dtype) for r in recording.records()])
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        ddp.zero_grad()
    return {"grads": grads, "sent": sent, "calls": calls}


def _link() -> Network:
    return Network(latency_us=LINK_LATENCY_US, bandwidth_gbps=10.0, name="slow link")


def _launch(hook: Callable | None) -> list[dict[str, Any]]:
    from labkit.backends import recording, simnet

    backend = recording.spec(simnet.spec(_link(), inner="gloo"))
    return launch(_run, world_size=WORLD_SIZE, backend=backend, args=(hook,), timeout=TIMEOUT_S)


_baseline: list[dict[str, Any]] = []  # DDP without a hook: the same in every check


def _without_hook() -> list[dict[str, Any]]:
    if not _baseline:
        _baseline.extend(_launch(None))
    return _baseline


def _check_grads(got: list[dict], want: list[dict]) -> None:
    names = [n for n, _ in _model().named_parameters()]
    for rank, (g, w) in enumerate(zip(got, want, strict=True)):
        for step in range(STEPS):
            for name, a, b in zip(names, g["grads"][step], w["grads"][step], strict=True):
                if a.dtype != torch.float32:
                    raise ExerciseFailed(
                        f"rank {rank}, step {step}: {name}.grad is {a.dtype}; copy the result "
                        "back into the float32 bucket.buffer() and return that buffer"
                    )
                if (a - b).norm() <= REL_TOL * b.norm() + 1e-8:
                    continue
                ratio = (a.norm() / b.norm()).item() if b.norm() > 0 else float("nan")
                hint = (
                    f" — {ratio:.2f}× the average: divide by the world size"
                    if abs(ratio - WORLD_SIZE) < 0.1
                    else ""
                )
                raise ExerciseFailed(
                    f"rank {rank}, step {step}: {name}.grad differs from DDP's average by "
                    f"{(a - b).norm() / b.norm():.1%} of its norm (allowed: bfloat16 rounding, "
                    f"{REL_TOL:.0%}){hint}"
                )


def _check_bytes(got: list[dict], want: list[dict]) -> int:
    for rank, (g, w) in enumerate(zip(got, want, strict=True)):
        for step in range(STEPS):
            ops = [row for row in g["sent"][step] if row[0] == "all_reduce"]
            base = sum(n for op, n, _ in w["sent"][step] if op == "all_reduce")
            dtypes = sorted({dt for _, _, dt in ops})
            if dtypes != ["bfloat16"]:
                raise ExerciseFailed(
                    f"rank {rank}, step {step}: the hook all-reduced {dtypes or 'nothing'}; "
                    "every all-reduce must be in bfloat16"
                )
            sent = sum(n for _, n, _ in ops)
            if 2 * sent != base:
                raise ExerciseFailed(
                    f"rank {rank}, step {step}: {sent} bytes all-reduced, expected half of the "
                    f"float32 buckets' {base} bytes"
                )
    return sum(n for op, n, _ in got[0]["sent"][-1] if op == "all_reduce")


def _check_in_flight(got: list[dict]) -> float:
    """The fraction of hook calls that returned before their all-reduce completed."""
    calls = [c for g in got for c in g["calls"]]
    if not calls:
        raise ExerciseFailed("DDP never called the hook")
    in_flight = sum(not done for _, done in calls) / len(calls)
    if in_flight < IN_FLIGHT_MIN:
        slowest = max(s for s, _ in calls)
        least = predict("all_reduce", 0, WORLD_SIZE, _link())
        raise ExerciseFailed(
            f"{1 - in_flight:.0%} of the hook's calls returned a future that was already "
            f"complete (up to {slowest * 1e3:.0f} ms inside the hook, on a link where every "
            f"all-reduce takes at least {least * 1e3:.0f} ms): the hook waited for its "
            "all-reduce, so backward stalled on every bucket and nothing overlapped. Issue it "
            "with async_op=True and return fut.then(...) without waiting"
        )
    return in_flight


@exercise("07_bf16_compress_hook", reference=bfloat16_compress_hook, prompt=PROMPT)
def check_bf16_compress_hook(fn: Callable[..., Any]) -> dict[str, int]:
    """Check a bfloat16 compression hook in real DDP on 2 ranks: results and bytes.

    Args:
        fn: the learner's ``fn(process_group, bucket) -> Future[Tensor]``.

    Returns:
        ``{"steps": n, "bytes_per_step": b, "float32_bytes_per_step": 2b, "in_flight": f}``,
        ``f`` the fraction of hook calls that returned with their all-reduce in flight.

    Raises:
        ExerciseFailed: gradients that are not the average (to bfloat16 precision), an
            all-reduce not in bfloat16, the wrong number of bytes, a hook that waits for its
            all-reduce before returning, or an error in a rank.
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet).
    """
    want = _without_hook()
    try:
        got = _launch(fn)
    except RankError as exc:
        if all(f.exc_type == "NotImplementedError" for f in exc.failures.values()):
            raise
        raise ExerciseFailed(f"on {WORLD_SIZE} ranks, {first_cause(exc)}") from exc
    _check_grads(got, want)
    sent = _check_bytes(got, want)
    in_flight = _check_in_flight(got)
    return {
        "steps": STEPS,
        "bytes_per_step": sent,
        "float32_bytes_per_step": 2 * sent,
        "in_flight": in_flight,
    }
