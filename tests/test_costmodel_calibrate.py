"""Calibration on made-up samples: machine_from_probes recovers the numbers they were made from."""

from __future__ import annotations

import math
import random

import pytest

from labkit.costmodel import predict_collective
from labkit.costmodel.calibrate import BackendProbes, Probes, machine_from_probes, pick, pool

KB, MB = 1 << 10, 1 << 20
ALPHA, BETA, DUPLEX = 80e-6, 0.4e-9, 1.7
OVERHEAD = {("all_reduce", 2): 150e-6, ("all_gather", 2): 170e-6, ("all_reduce", 4): 900e-6}
ROUND = {2: 12e-6, 4: 90e-6}
COPY = {1: {256 * KB: 0.03e-9, 16 * MB: 0.1e-9}, 4: {256 * KB: 0.06e-9, 16 * MB: 0.3e-9}}
ADD = {1: {256 * KB: 0.05e-9, 16 * MB: 0.12e-9}, 4: {256 * KB: 0.1e-9, 16 * MB: 0.4e-9}}
COMPUTE = {2: 1.1, 4: 2.3}
SYNC = {("all_reduce", 2): 0.3e-3, ("all_gather", 4): 2.5e-3}


def noisy(t: float, rng: random.Random, k: int = 9) -> list[float]:
    """k samples: the true time once, the others late by up to 3x (a busy machine only adds)."""
    return [t] + [t * (1 + 2 * rng.random()) for _ in range(k - 1)]


def make_probes(seed: int = 0) -> Probes:
    rng = random.Random(seed)
    p2p = [(n, noisy(ALPHA + n * BETA, rng)) for n in (8, 64 * KB, MB, 4 * MB)]
    one = ALPHA + 4 * MB * BETA
    exchange = [(4 * MB, noisy(DUPLEX * one, rng), noisy(one, rng))]
    tiny = {k: noisy(v, rng) for k, v in OVERHEAD.items()}
    tiny |= {("barrier", p): noisy(v, rng) for p, v in ROUND.items()}
    shm = BackendProbes("labkit_shm", "labkit_shm", p2p, exchange, tiny, {2: MB, 4: 4 * MB})
    gloo = BackendProbes("gloo", "gloo", p2p, exchange, dict(tiny), {2: 0, 4: 0})
    gloo.between = {k: ([1e-3 + v], [1e-3]) for k, v in SYNC.items()}
    rates = {
        key: {p: [(n, noisy(r * n, rng)) for n, r in t.items()] for p, t in table.items()}
        for key, table in (("copy", COPY), ("add", ADD))
    }
    compute = {p: (noisy(1e-3, rng), noisy(f * 1e-3, rng)) for p, f in COMPUTE.items()}
    return Probes(2, rates["copy"], rates["add"], compute, [gloo, shm])


def test_pick():
    assert pick([3, 1, 2], "min") == 1 and pick([3, 1, 2], "median") == 2
    with pytest.raises(ValueError):
        pick([1], "mean")
    with pytest.raises(ValueError):
        pick([], "min")


def test_recovers_every_parameter_from_the_fastest_samples():
    m = machine_from_probes(make_probes(), "min")
    for name in ("gloo", "labkit_shm"):
        b = m.backend(name)
        assert math.isclose(b.alpha, ALPHA, rel_tol=1e-9)
        assert math.isclose(b.beta, BETA, rel_tol=1e-9)
        assert math.isclose(b.duplex, DUPLEX, rel_tol=1e-9)
        assert b.overhead_s == pytest.approx(OVERHEAD, rel=1e-12)
    assert m.backend("labkit_shm").round_s == pytest.approx(ROUND, rel=1e-12)
    assert m.backend("labkit_shm").chunk_bytes == {2: MB, 4: 4 * MB}
    assert m.backend("gloo").round_s == {}  # gloo has no rounds to price
    assert m.backend("gloo").sync_s == pytest.approx(SYNC, rel=1e-9)
    gloo = m.backend("gloo")  # between bursts of compute a call costs its measured sync_s
    assert gloo.overhead("all_reduce", 2, between_compute=True) == pytest.approx(0.3e-3)
    assert gloo.overhead("all_reduce", 2) == pytest.approx(150e-6)  # back to back
    assert gloo.overhead("all_reduce", 4, between_compute=True) == pytest.approx(900e-6)
    for p in COPY:
        for n in COPY[p]:
            assert math.isclose(m.copy_rate(p, n), COPY[p][n], rel_tol=1e-12)
            assert math.isclose(m.add_rate(p, n), ADD[p][n], rel_tol=1e-12)
    assert m.compute_share == pytest.approx(COMPUTE, rel=1e-12)


def test_medians_are_later_than_minima():
    probes = make_probes(seed=3)
    fast, typical = machine_from_probes(probes, "min"), machine_from_probes(probes, "median")
    f, t = fast.backend("gloo"), typical.backend("gloo")
    assert all(t.overhead_s[k] > f.overhead_s[k] for k in OVERHEAD)
    assert (t.alpha, t.beta) == (f.alpha, f.beta)  # the ping-pong's line: fastest samples
    for p in COPY:
        assert all(typical.copy_rate(p, n) > fast.copy_rate(p, n) for n in COPY[p])
    assert all(typical.compute_share[p] > fast.compute_share[p] for p in COMPUTE)
    assert predict_collective(typical, "gloo", "all_gather", 64 * KB, 2) > predict_collective(
        fast, "gloo", "all_gather", 64 * KB, 2
    )


def test_duplex_is_at_least_one():
    probes = make_probes()
    probes.backends[0].exchange = [(MB, [1e-3], [2e-3])]  # faster both ways than one way
    assert machine_from_probes(probes).backend("gloo").duplex == 1.0


def test_a_ping_pong_that_does_not_grow_still_gives_a_line():
    probes = make_probes()
    probes.backends[0].p2p = [(8, [2e-3]), (MB, [1e-3])]  # a busy moment at the small size
    b = machine_from_probes(probes).backend("gloo")
    assert b.alpha == 2e-3 and b.beta == pytest.approx(1e-3 / MB)


def test_calls_between_compute_are_priced_as_measured_at_the_measured_sizes():
    # a call between bursts of compute measured at 128 KB and 1 MB on 2 ranks, and on pairs
    # inside 4 ranks: the model prices it there as measured, between them log-linearly
    probes = make_probes()
    gloo = probes.backends[0]
    burst, between = 1e-3, {(2, 2, 128 * KB): 2e-3, (2, 2, MB): 3e-3, (2, 4, 128 * KB): 4e-3}
    gloo.sized = {
        ("all_reduce", q, n, p): ([burst + t], [burst]) for (q, p, n), t in between.items()
    }
    m = machine_from_probes(probes, "min")
    b = m.backend("gloo")
    for (q, p, n), t in between.items():
        got = predict_collective(m, "gloo", "all_reduce", n, q, True, world=p)
        assert got == pytest.approx(t, rel=1e-9)
    # the smallest call keeps its own measurement (sync_s), the wake grows with the size
    assert b.wake_s[("all_reduce", 2)][8] == pytest.approx(SYNC[("all_reduce", 2)] - 150e-6)
    assert b.overhead("all_reduce", 2, True, 8) == pytest.approx(SYNC[("all_reduce", 2)])
    mid = 362 * KB  # half way between 128 KB and 1 MB in log2
    w = b.wake_s[("all_reduce", 2)]
    assert b.overhead("all_reduce", 2, True, mid) == pytest.approx(
        150e-6 + (w[128 * KB] + w[MB]) / 2, rel=1e-3
    )
    # back to back, nothing changes; a group of 2 inside an unmeasured world: the 2-rank price
    assert b.overhead("all_reduce", 2, False, MB) == pytest.approx(150e-6)
    alone = predict_collective(m, "gloo", "all_reduce", MB, 2, True)
    assert predict_collective(m, "gloo", "all_reduce", MB, 2, True, world=8) == alone
    # a call faster between bursts than the model's back-to-back price costs nothing extra
    gloo.sized = {("all_reduce", 2, MB, 2): ([burst], [burst])}
    assert machine_from_probes(probes, "min").backend("gloo").wake_s[("all_reduce", 2)][MB] == 0


def test_the_wake_of_calls_between_bursts_is_the_line_through_the_sizes_measured():
    # extras beyond back to back of 1, 3 and 2 ms at 1, 2 and 3 MB (reduce_scatter on pairs
    # inside 4 ranks): least squares, 0.5 ms per MB through (2 MB, 2 ms): 1.5, 2.0, 2.5 ms
    probes = make_probes()
    gloo, burst = probes.backends[0], 1e-3
    model = machine_from_probes(probes, "min")

    def wake(extras: dict[int, float]) -> dict[int, float]:
        gloo.sized = {
            ("reduce_scatter", 2, n, 4): (
                [burst + t + predict_collective(model, "gloo", "reduce_scatter", n, 2)],
                [burst],
            )
            for n, t in extras.items()
        }
        return machine_from_probes(probes, "min").backend("gloo").wake_s[("reduce_scatter", 2, 4)]

    got = wake({MB: 1e-3, 2 * MB: 3e-3, 3 * MB: 2e-3})
    assert [got[n] for n in (MB, 2 * MB, 3 * MB)] == pytest.approx([1.5e-3, 2e-3, 2.5e-3])
    # falling with the size: no part per byte, their mean
    got = wake({MB: 3e-3, 2 * MB: 2e-3, 3 * MB: 1e-3})
    assert [got[n] for n in (MB, 2 * MB, 3 * MB)] == pytest.approx([2e-3] * 3)
    # a line that would cross below zero at no bytes: through the origin instead
    got = wake({MB: 0.0, 2 * MB: 0.0, 3 * MB: 6e-3})
    assert got[MB] == pytest.approx(18e-3 / 14) and got[3 * MB] == pytest.approx(54e-3 / 14)


def test_pool_puts_every_terms_samples_of_several_calibrations_together():
    a, b = make_probes(seed=1), make_probes(seed=2)
    b.backends[0].sized = {("all_reduce", 2, MB, 2): ([3e-3], [1e-3])}
    a.backends[0].sized_cpu = {("all_reduce", 2, MB, 4): ([2e-3], [1e-3])}
    b.backends[0].sized_cpu = {("all_reduce", 2, MB, 4): ([4e-3], [1e-3])}
    both = pool(a, b)
    assert both.cores == 2 and [x.name for x in both.backends] == ["gloo", "labkit_shm"]
    for name in ("copy", "add"):
        for q, rows in getattr(both, name).items():
            for (n, s), (n1, s1), (n2, s2) in zip(
                rows, getattr(a, name)[q], getattr(b, name)[q], strict=True
            ):
                assert n == n1 == n2 and s == [*s1, *s2]
    g, g1, g2 = both.backends[0], a.backends[0], b.backends[0]
    assert g.tiny[("all_reduce", 2)] == [*g1.tiny[("all_reduce", 2)], *g2.tiny[("all_reduce", 2)]]
    assert g.p2p[0][1] == [*g1.p2p[0][1], *g2.p2p[0][1]]
    assert g.exchange[0][1] == [*g1.exchange[0][1], *g2.exchange[0][1]]
    assert g.between[("all_reduce", 2)][0] == [*g1.between[("all_reduce", 2)][0]] * 2
    assert g.sized == {("all_reduce", 2, MB, 2): ([3e-3], [1e-3])}  # measured in one only
    assert g.sized_cpu == {("all_reduce", 2, MB, 4): ([2e-3, 4e-3], [1e-3, 1e-3])}
    assert both.compute_share[4][1] == [*a.compute_share[4][1], *b.compute_share[4][1]]
    # the fastest of both is the fastest of either; a calibration pooled with itself is itself
    fast = machine_from_probes(both, "min")
    assert fast.copy_rate(4, 16 * MB) == min(
        machine_from_probes(x, "min").copy_rate(4, 16 * MB) for x in (a, b)
    )
    assert machine_from_probes(pool(a, a), "min") == machine_from_probes(a, "min")
    with pytest.raises(ValueError, match="at least one"):
        pool()


def test_the_cpu_of_a_pairs_call_is_the_line_through_the_sizes_measured():
    # CPU seconds per burst with an all-gather of pairs inside 4 ranks, less per burst alone:
    # 0.4, 0.6 and 0.8 ms at 1, 2 and 3 MB (noisy samples: the medians are these)
    probes = make_probes()
    gloo, rng = probes.backends[0], random.Random(3)
    cpu = {MB: 0.4e-3, 2 * MB: 0.6e-3, 3 * MB: 0.8e-3}
    burst = 0.3e-3
    gloo.sized_cpu = {
        ("all_gather", 2, n, 4): (
            [burst + t, burst + t - 1e-5, burst + t + 1e-5 * rng.random()],
            [burst, burst - 1e-5, burst + 1e-5],
        )
        for n, t in cpu.items()
    }
    b = machine_from_probes(probes, "median").backend("gloo")
    assert set(b.cpu_s) == {("all_gather", 2, 4)}
    assert [b.cpu_s[("all_gather", 2, 4)][n] for n in cpu] == pytest.approx(list(cpu.values()))
    assert b.cpu("all_gather", 2, 4, 1.5 * MB) == pytest.approx(0.5e-3, rel=0.05)  # log-linear
    assert b.cpu("all_gather", 2, 4, 64 * MB) == pytest.approx(0.8e-3)  # constant beyond
    assert b.cpu("all_reduce", 2, 4, MB) is None  # not measured
    # a call that costs less CPU than the bursts alone (noise) costs none
    gloo.sized_cpu = {("all_gather", 2, MB, 4): ([burst - 1e-5], [burst])}
    assert machine_from_probes(probes, "median").backend("gloo").cpu_s[("all_gather", 2, 4)] == {
        MB: 0.0
    }


def test_the_hand_off_is_its_round_less_two_private_copies_per_byte():
    # 1 MiB: rounds of 300-320 us against private copies of 50-60 us: (300 − 2·50) / MiB at
    # the fastest, (310 − 2·55) / MiB at the medians; a round faster than two copies is 0
    probes = make_probes()
    shm = probes.backends[1]
    assert shm.name == "labkit_shm" and shm.handoff == {}
    shm.handoff = {
        (2, MB): ([300e-6, 310e-6, 320e-6], [50e-6, 55e-6, 60e-6]),
        (4, MB): ([90e-6, 95e-6], [50e-6, 55e-6]),
    }
    fast = machine_from_probes(probes, "min").backend("labkit_shm")
    typical = machine_from_probes(probes, "median").backend("labkit_shm")
    assert fast.handoff_s[2] == pytest.approx(200e-6 / MB)
    assert typical.handoff_s[2] == pytest.approx(200e-6 / MB)
    assert fast.handoff_s[4] == 0.0 and typical.handoff_s[4] == 0.0
    assert machine_from_probes(probes, "min").backend("gloo").handoff_s == {}
    # pooled: the samples of both calibrations, world size by world size
    other = make_probes()
    other.backends[1].handoff = {(2, MB): ([250e-6], [50e-6])}
    both = pool(probes, other).backends[-1]
    assert both.handoff[(2, MB)] == ([300e-6, 310e-6, 320e-6, 250e-6], [50e-6, 55e-6, 60e-6, 50e-6])
    assert both.handoff[(4, MB)] == shm.handoff[(4, MB)]
