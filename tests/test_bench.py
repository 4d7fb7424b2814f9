"""Tests for labkit/bench.py: ping-pong rows on 2 ranks, the α-β fit, sizes and the table."""

from __future__ import annotations

import math

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.bench import (
    AlphaBeta,
    BenchResult,
    alpha_beta_fit,
    format_table,
    message_sizes,
    p2p_pingpong,
)

SIZES = [1, 1024, 64 * 1024, 4, 1024]  # unsorted, with a duplicate: rows come back sorted


def _row(n_bytes: int, time_s: float, times_s: tuple[float, ...] | None = None) -> BenchResult:
    bw = n_bytes / time_s / 1e9
    samples = (time_s,) if times_s is None else times_s
    return BenchResult("p2p", n_bytes, time_s, bw, bw, 2, "gloo", "cpu", len(samples), samples)


@pytest.fixture(scope="module")
def pingpong_rows() -> list[list[BenchResult]]:
    # 3 ranks: rank 2 is neither src nor dst and must return at once with no rows.
    return lk.launch(
        lambda rank, ws: p2p_pingpong(SIZES, iters=3, warmup=1),
        world_size=3,
        device="cpu",
        timeout=60,
    )


def test_pingpong_rows_on_src_only(pingpong_rows) -> None:
    rows, on_dst, on_bystander = pingpong_rows
    assert on_dst == [] and on_bystander == []
    assert [r.n_bytes for r in rows] == sorted(set(SIZES))


def test_pingpong_row_fields(pingpong_rows) -> None:
    for r in pingpong_rows[0]:
        assert r.op == "p2p" and r.backend == "gloo" and r.device == "cpu"
        assert r.world_size == 3 and r.iters == 3 and len(r.times_s) == 3
        assert r.time_s == sorted(r.times_s)[1]  # the median of 3 samples
        assert r.time_min_s == min(r.times_s)
        assert r.time_s > 0
        assert math.isclose(r.algbw_gbps, r.n_bytes / r.time_s / 1e9, rel_tol=1e-12)
        assert r.busbw_gbps == r.algbw_gbps  # bus factor 1 for point-to-point
        assert math.isclose(r.latency_us, r.time_s * 1e6) and r.bandwidth_gbps == r.algbw_gbps
        assert "times_s" not in r.as_dict() and r.as_dict()["n_bytes"] == r.n_bytes


def test_pingpong_other_pair_and_subgroup() -> None:
    def run(rank: int, ws: int) -> tuple[list, list]:
        sub = dist.new_group([1, 2])  # every rank calls new_group, members or not
        other_pair = p2p_pingpong([8, 16], iters=2, warmup=0, src=2, dst=1)
        in_group = p2p_pingpong([8], iters=2, warmup=0, group=sub, src=1, dst=2)
        return [r.n_bytes for r in other_pair], [r.world_size for r in in_group]

    out = lk.launch(run, world_size=3, device="cpu", timeout=60)
    assert [o[0] for o in out] == [[], [], [8, 16]]  # src=2 measures
    assert [o[1] for o in out] == [[], [2], []]  # the group of 2 reports its own size


@pytest.mark.parametrize(
    "kwargs",
    [
        {"sizes_bytes": []},
        {"sizes_bytes": [0, 8]},
        {"sizes_bytes": [8], "iters": 0},
        {"sizes_bytes": [8], "warmup": -1},
        {"sizes_bytes": [8], "src": 1, "dst": 1},
    ],
)
def test_pingpong_rejects_bad_arguments(kwargs) -> None:
    with pytest.raises(ValueError):
        p2p_pingpong(**kwargs)  # checked before any communication: no process group needed


def test_fit_recovers_alpha_beta_exactly() -> None:
    alpha, beta = 25e-6, 1 / 3.2e9  # 25 µs, 3.2 GB/s
    rows = [_row(n, alpha + n * beta) for n in message_sizes(1, 1 << 26, 4)]
    for relative in (True, False):
        fit = alpha_beta_fit(rows, relative=relative)
        torch.testing.assert_close(fit.alpha, alpha, rtol=1e-9, atol=0.0)
        torch.testing.assert_close(fit.beta, beta, rtol=1e-9, atol=0.0)
    fit = alpha_beta_fit(rows)
    torch.testing.assert_close(fit.bandwidth_gbps, 3.2, rtol=1e-9, atol=0.0)
    torch.testing.assert_close(fit.latency_us, 25.0, rtol=1e-9, atol=0.0)
    torch.testing.assert_close(fit.n_half_bytes, alpha / beta, rtol=1e-9, atol=0.0)
    torch.testing.assert_close(fit.time_s(1e6), alpha + 1e6 * beta, rtol=1e-12, atol=0.0)


def test_fit_matches_numpy_least_squares_on_noisy_data() -> None:
    gen = torch.Generator().manual_seed(0)
    sizes = message_sizes(1, 1 << 24, 2)
    noise = 1 + 0.2 * (torch.rand(len(sizes), generator=gen, dtype=torch.float64) - 0.5)
    times = [(50e-6 + n * 1e-9) * float(e) for n, e in zip(sizes, noise, strict=True)]
    rows = [_row(n, t) for n, t in zip(sizes, times, strict=True)]
    x = torch.tensor(sizes, dtype=torch.float64)
    y = torch.tensor(times, dtype=torch.float64)
    design = torch.stack([torch.ones_like(x), x], dim=1)
    for relative, w in ((False, torch.ones_like(y)), (True, 1 / y)):
        ref = torch.linalg.lstsq(design * w[:, None], y * w).solution
        fit = alpha_beta_fit(rows, relative=relative)
        got = torch.tensor([fit.alpha, fit.beta], dtype=torch.float64)
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-12)


def test_relative_fit_keeps_alpha_from_small_messages() -> None:
    # A 10% slow 16 MB point moves plain least squares' α by far more than α itself.
    alpha, beta = 20e-6, 1e-9
    sizes = message_sizes(1, 1 << 24, 4)
    times = [alpha + n * beta for n in sizes]
    times[-1] *= 1.1
    rows = [_row(n, t) for n, t in zip(sizes, times, strict=True)]
    assert abs(alpha_beta_fit(rows).alpha - alpha) < 0.1 * alpha
    assert abs(alpha_beta_fit(rows, relative=False).alpha - alpha) > alpha


def test_fit_on_minimum_ignores_slow_samples() -> None:
    alpha, beta = 30e-6, 1 / 2e9
    rows = []
    for n in message_sizes(1, 1 << 24, 4):
        t = alpha + n * beta
        stalled = (t + 2e-3, t + 4e-3, t, t + 2e-3)  # a busy machine's scheduling delays
        rows.append(_row(n, sorted(stalled)[2], stalled))
    fit = alpha_beta_fit(rows, stat="min")
    torch.testing.assert_close(fit.alpha, alpha, rtol=1e-9, atol=0.0)
    torch.testing.assert_close(fit.beta, beta, rtol=1e-9, atol=0.0)
    assert alpha_beta_fit(rows).alpha > 1e-3  # the medians carry the delays
    with pytest.raises(ValueError, match="stat"):
        alpha_beta_fit(rows, stat="mean")


def test_fit_rejects_too_little_data() -> None:
    with pytest.raises(ValueError, match="two different sizes"):
        alpha_beta_fit([_row(8, 1e-5), _row(8, 2e-5)])
    with pytest.raises(ValueError, match="positive"):
        alpha_beta_fit([_row(8, 1e-5), BenchResult("p2p", 16, 0.0, 0, 0, 2, "g", "c", 1)])


def test_alpha_beta_with_zero_beta() -> None:
    fit = AlphaBeta(alpha=1e-5, beta=0.0)
    assert fit.bandwidth_gbps == float("inf") and fit.n_half_bytes == float("inf")


def test_message_sizes() -> None:
    assert message_sizes(1, 64, 4) == [1, 4, 16, 64]
    assert message_sizes(8, 100, 2) == [8, 16, 32, 64]
    assert message_sizes(5, 5) == [5]
    for bad in ((0, 8, 2), (16, 8, 2), (1, 8, 1)):
        with pytest.raises(ValueError):
            message_sizes(*bad)


def test_format_table() -> None:
    text = format_table([_row(8, 1e-5), _row(1 << 20, 1e-3)])
    lines = text.splitlines()
    assert len(lines) == 3 and "busbw (GB/s)" in lines[0] and "min (us)" in lines[0]
    assert lines[2].split() == ["p2p", "1048576", "1000.0", "1000.0", "1.0486", "1.0486"]
    slow = format_table([_row(8, 3e-5, (1e-5, 3e-5, 5e-5))]).splitlines()[1].split()
    assert slow[2:4] == ["30.0", "10.0"]  # median, then minimum
