"""Tests for labkit/costmodel: closed forms for small p, monotonicity, crossovers, fit, busbw."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

import labkit as lk
from labkit.costmodel import (
    ALGORITHMS,
    COLLECTIVES,
    DEFAULT_ALGORITHM,
    PRESETS,
    SEGMENTED,
    Network,
    algbw,
    best_algorithm,
    best_segments,
    busbw,
    busbw_factor,
    cost_terms,
    crossover_bytes,
    fit,
    pipelined_tree_terms,
    predict,
    predict_all,
    what_if,
)

# α = 10 µs, β = 1 ns/byte (1 GB/s), γ = 0.25 ns/byte: round numbers for hand arithmetic.
NET = Network(latency_us=10.0, bandwidth_gbps=1.0, gamma_s_per_byte=0.25e-9, name="test")
A, B, G = 10e-6, 1e-9, 0.25e-9
N = 1 << 20
CASES = [(c, a) for c in COLLECTIVES for a in ALGORITHMS[c]]
LINEAR = [case for case in CASES if case not in SEGMENTED]  # cost_terms(c, p, a) alone


def close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-18)


def test_network_units_and_validation() -> None:
    assert close(NET.alpha, 10e-6) and close(NET.beta, 1e-9) and NET.gamma == 0.25e-9
    assert close(NET.n_half_bytes, 10_000) and close(NET.p2p_time_s(1000), 11e-6)
    assert "1/β = 1 GB/s" in NET.label()
    for bad in (
        {"latency_us": -1, "bandwidth_gbps": 1},
        {"latency_us": 1, "bandwidth_gbps": 0},
        {"latency_us": 1, "bandwidth_gbps": 1, "gamma_s_per_byte": -1e-9},
        {"latency_us": float("nan"), "bandwidth_gbps": 1},
    ):
        with pytest.raises(ValueError):
            Network(**bad)
    with pytest.raises(AttributeError):
        NET.latency_us = 3  # frozen


def test_presets() -> None:
    assert set(PRESETS) == {"loopback", "10GbE", "100Gb-IB", "NVLink"}
    ten = Network.preset("10gbe")
    assert ten is PRESETS["10GbE"] and close(ten.beta, 1 / 1.25e9)  # 10 Gbit/s = 1.25 GB/s
    assert Network.preset("100Gb-IB").bandwidth_gbps == 12.5
    # Faster hardware: less latency and more bandwidth, in the order listed.
    ib, nvl = Network.preset("100Gb-IB"), Network.preset("NVLink")
    assert ten.alpha > ib.alpha and ten.beta > ib.beta > nvl.beta
    with pytest.raises(ValueError, match="known: loopback, 10GbE"):
        Network.preset("carrier pigeon")
    assert lk.Network is Network


@pytest.mark.parametrize(
    ("collective", "algorithm", "p", "expected"),
    [
        # all_reduce, TRG §4, p = 4 (lg p = 2)
        ("all_reduce", "ring", 4, 6 * A + 1.5 * N * B + 0.75 * N * G),
        ("all_reduce", "tree", 4, 4 * A + 4 * N * B + 2 * N * G),
        ("all_reduce", "recursive_doubling", 4, 2 * A + 2 * N * B + 2 * N * G),
        ("all_reduce", "rabenseifner", 4, 4 * A + 1.5 * N * B + 0.75 * N * G),
        ("all_reduce", "naive", 4, 6 * A + 6 * N * B + 3 * N * G),
        # p = 3: not a power of two (p' = 2, fold + unfold)
        ("all_reduce", "recursive_doubling", 3, 3 * A + 3 * N * B + 2 * N * G),
        ("all_reduce", "rabenseifner", 3, 4 * A + 3 * N * B + 1.5 * N * G),
        ("all_reduce", "tree", 3, 4 * A + 4 * N * B + 2 * N * G),  # ⌈lg 3⌉ = 2
        ("all_reduce", "ring", 2, 2 * A + N * B + 0.5 * N * G),
        # all_gather TRG §3.1, reduce_scatter §3.3
        ("all_gather", "ring", 4, 3 * A + 0.75 * N * B),
        ("all_gather", "recursive_doubling", 8, 3 * A + 0.875 * N * B),
        ("all_gather", "recursive_doubling", 5, 3 * A + 0.8 * N * B),  # Bruck: ⌈lg 5⌉
        ("reduce_scatter", "ring", 4, 3 * A + 0.75 * N * (B + G)),
        ("reduce_scatter", "pairwise", 4, 3 * A + 0.75 * N * (B + G)),
        ("reduce_scatter", "recursive_halving", 4, 2 * A + 0.75 * N * (B + G)),
        # broadcast §3.2, reduce §4
        ("broadcast", "tree", 8, 3 * A + 3 * N * B),
        ("broadcast", "scatter_allgather", 8, 10 * A + 1.75 * N * B),
        ("reduce", "tree", 4, 2 * A + 2 * N * (B + G)),
        ("reduce", "reduce_scatter_gather", 4, 4 * A + 1.5 * N * B + 0.75 * N * G),
        ("reduce", "reduce_scatter_gather", 3, 3 * A + 2 * N * B + 1.5 * N * G),
        # gather / scatter / all_to_all / p2p
        ("gather", "tree", 4, 2 * A + 0.75 * N * B),
        ("scatter", "linear", 4, 3 * A + 0.75 * N * B),
        ("all_to_all", "pairwise", 4, 3 * A + 0.75 * N * B),
        ("all_to_all", "bruck", 8, 3 * A + 1.5 * N * B),
        ("p2p", "direct", 2, A + N * B),
    ],
)
def test_known_values_for_small_p(collective, algorithm, p, expected) -> None:
    assert close(predict(collective, N, p, NET, algorithm), expected)


@pytest.mark.parametrize(("collective", "algorithm"), LINEAR)
def test_one_rank_costs_nothing_and_zero_bytes_cost_latency(collective, algorithm) -> None:
    if collective != "p2p":
        assert predict(collective, N, 1, NET, algorithm) == 0.0
    terms = cost_terms(collective, 4, algorithm)
    assert close(predict(collective, 0, 4, NET, algorithm), terms.steps * A)
    assert terms.formula and terms.source.startswith(("TRG", "TRG §2"))


# Algorithms that fold the ranks above a power of two into partners: dearer at p = 2^k − 1
# than at 2^k, so their cost is monotone in p only along powers of two.
FOLDING = {
    ("all_reduce", "recursive_doubling"),
    ("all_reduce", "rabenseifner"),
    ("reduce_scatter", "recursive_halving"),
    ("reduce", "reduce_scatter_gather"),
}


@pytest.mark.parametrize(("collective", "algorithm"), CASES)
def test_monotone_in_size_and_ranks(collective, algorithm) -> None:
    sizes = [0, 1, 1000, 1 << 20, 1 << 30]
    for p in (2, 3, 4, 7, 8, 64, 1000, 4096):
        times = [predict(collective, n, p, NET, algorithm) for n in sizes]
        assert times == sorted(times) and times[-1] > times[0]
    ranks = [1 << k for k in range(13)] if (collective, algorithm) in FOLDING else range(1, 70)
    for n in sizes:
        times = [predict(collective, n, p, NET, algorithm) for p in ranks]
        assert all(b >= a for a, b in zip(times, times[1:], strict=False)), (n, times)


@pytest.mark.parametrize(("collective", "algorithm"), sorted(FOLDING))
def test_folding_makes_one_rank_short_of_a_power_of_two_dearer(collective, algorithm) -> None:
    for k in (3, 6, 10):
        below, at = (predict(collective, N, p, NET, algorithm) for p in (2**k - 1, 2**k))
        assert below > at


def test_default_algorithms_and_errors() -> None:
    for collective in COLLECTIVES:
        assert DEFAULT_ALGORITHM[collective] in ALGORITHMS[collective]
        assert predict(collective, N, 4, NET) == predict(
            collective, N, 4, NET, DEFAULT_ALGORITHM[collective]
        )
    with pytest.raises(ValueError, match="unknown collective 'allreduce'"):
        predict("allreduce", N, 4, NET)
    with pytest.raises(ValueError, match="known: ring, tree"):
        predict("all_reduce", N, 4, NET, "butterfly")
    with pytest.raises(ValueError, match="world_size"):
        predict("all_reduce", N, 0, NET)
    with pytest.raises(ValueError, match="n_bytes"):
        predict("all_reduce", -1, 4, NET)


def test_ring_is_bandwidth_optimal_at_scale() -> None:
    # Ring all-reduce sends 2(p−1)/p·n < 2n per rank, so its busbw tends to 1/β at any p.
    big = 1 << 34
    for p in (2, 8, 1024, 8192):
        t = predict("all_reduce", big, p, Network(10, 1.0))
        assert 0.99 < busbw("all_reduce", big, t, p) <= 1.0
    # ...while the α term grows linearly with p: at 8192 ranks small messages suffer.
    small = 1024
    ring = predict("all_reduce", small, 8192, NET, "ring")
    rd = predict("all_reduce", small, 8192, NET, "recursive_doubling")
    assert close(ring, 2 * 8191 * A + 2 * 8191 / 8192 * small * B + 8191 / 8192 * small * G)
    assert ring > 100 * rd


@pytest.mark.parametrize("p", [2, 4, 8, 16, 1024])
def test_crossover_ring_vs_recursive_doubling_closed_form(p) -> None:
    net = Network(10.0, 1.0)  # γ = 0
    lg = math.log2(p)
    n_star = crossover_bytes("all_reduce", p, net, "recursive_doubling", "ring")
    if p == 2:  # 2(p−1)/p = lg p = 1 and 2(p−1) = 2 > lg p: ring never wins
        assert n_star is None
        return
    want = (2 * (p - 1) - lg) / (lg - 2 * (p - 1) / p) * net.alpha / net.beta
    assert math.isclose(n_star, want, rel_tol=1e-12)
    rd, ring = (predict("all_reduce", n_star, p, net, a) for a in ("recursive_doubling", "ring"))
    assert math.isclose(rd, ring, rel_tol=1e-12)
    assert best_algorithm("all_reduce", n_star / 2, p, net, ["recursive_doubling", "ring"]) == (
        "recursive_doubling"
    )
    assert best_algorithm("all_reduce", n_star * 2, p, net, ["ring", "recursive_doubling"]) == (
        "ring"
    )


def test_crossover_with_gamma_and_broadcast() -> None:
    p = 8
    n_star = crossover_bytes("all_reduce", p, NET, "recursive_doubling", "ring")
    want = (2 * 7 - 3) * A / ((3 - 1.75) * B + (3 - 0.875) * G)
    assert math.isclose(n_star, want, rel_tol=1e-12)
    # Broadcast: tree vs scatter+all-gather, n* = (p−1)α / ((⌈lg p⌉ − 2(p−1)/p)β).
    n_bc = crossover_bytes("broadcast", p, NET, "tree", "scatter_allgather")
    assert math.isclose(n_bc, 7 * A / ((3 - 1.75) * B), rel_tol=1e-12)
    # Same algorithm twice, and lines that never cross at a positive size.
    assert crossover_bytes("all_reduce", p, NET, "ring", "ring") is None
    assert crossover_bytes("all_reduce", p, NET, "rabenseifner", "naive") is None


def test_predict_all_best_and_what_if() -> None:
    times = predict_all("all_reduce", N, 8, NET)
    assert list(times) == list(ALGORITHMS["all_reduce"])
    assert best_algorithm("all_reduce", 8, 8, NET) == "recursive_doubling"
    assert best_algorithm("all_reduce", 1 << 30, 8, NET) == "rabenseifner"  # 2 lg p < 2(p−1)
    rows = what_if("all_reduce", N, [8, 1024], NET, ["ring", "tree"])
    assert [(r["world_size"], r["algorithm"]) for r in rows] == [
        (8, "ring"),
        (8, "tree"),
        (1024, "ring"),
        (1024, "tree"),
    ]
    for r in rows:
        assert close(r["time_s"], predict("all_reduce", N, r["world_size"], NET, r["algorithm"]))
        assert close(r["busbw_fraction"], r["busbw_gbps"] / NET.bandwidth_gbps)


@pytest.mark.parametrize(
    ("collective", "factors"),
    [
        ("all_reduce", {1: 0.0, 2: 1.0, 4: 1.5, 8: 1.75}),
        ("all_gather", {2: 0.5, 4: 0.75}),
        ("reduce_scatter", {2: 0.5, 8: 0.875}),
        ("all_to_all", {4: 0.75}),
        ("gather", {4: 0.75}),
        ("broadcast", {1: 1.0, 4: 1.0, 1024: 1.0}),
        ("reduce", {8: 1.0}),
        ("p2p", {2: 1.0}),
    ],
)
def test_busbw_factors_follow_nccl_tests(collective, factors) -> None:
    for p, want in factors.items():
        assert busbw_factor(collective, p) == want


def test_algbw_busbw_and_errors() -> None:
    assert algbw(2e9, 2.0) == 1.0
    assert busbw("all_reduce", 2e9, 2.0, 4) == 1.5
    with pytest.raises(ValueError):
        algbw(1, 0)
    with pytest.raises(ValueError, match="unknown collective"):
        busbw_factor("allreduce", 4)
    with pytest.raises(ValueError):
        busbw_factor("all_reduce", 0)


@pytest.mark.parametrize("relative", [True, False])
@pytest.mark.parametrize(("alpha", "beta"), [(25e-6, 1 / 1.25e9), (1.6e-3, 1e-9), (0.0, 2e-10)])
def test_fit_recovers_alpha_beta_exactly(relative, alpha, beta) -> None:
    sizes = [1, 64, 4096, 1 << 16, 1 << 20, 1 << 24]
    times = [alpha + n * beta for n in sizes]
    net = fit(sizes, times, relative=relative, name="synthetic")
    assert math.isclose(net.alpha, alpha, rel_tol=1e-9, abs_tol=1e-15)
    assert math.isclose(net.beta, beta, rel_tol=1e-9)
    assert net.gamma == 0 and net.name == "synthetic"


def test_fit_constrains_alpha_and_rejects_bad_input() -> None:
    sizes = [1000, 2000, 3000]
    net = fit(sizes, [0.5e-6, 1.5e-6, 2.5e-6], relative=False)  # unconstrained α < 0
    assert net.alpha == 0.0 and net.beta > 0
    with pytest.raises(ValueError, match="two different sizes"):
        fit([8, 8], [1e-3, 1e-3])
    with pytest.raises(ValueError, match="positive"):
        fit([8, 16], [1e-3, 0])
    with pytest.raises(ValueError, match="do not grow"):
        fit([8, 16, 32], [3e-3, 2e-3, 1e-3])
    with pytest.raises(ValueError, match="2 sizes but 1 times"):
        fit([8, 16], [1e-3])


def test_from_alpha_beta_round_trip() -> None:
    net = Network.from_alpha_beta(A, B, G, name="x")
    assert close(net.alpha, A) and close(net.beta, B) and net.gamma == G
    with pytest.raises(ValueError):
        Network.from_alpha_beta(A, 0)


def test_costmodel_imports_no_torch() -> None:
    code = "import sys, labkit.costmodel; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- the pipelined (double binary) tree: Sanders, Speck and Träff 2009 ------------------------


@pytest.mark.parametrize(("p", "k"), [(2, 1), (4, 1), (4, 2), (5, 4), (8, 3), (1024, 10)])
def test_pipelined_tree_closed_form(p, k) -> None:
    lg = math.ceil(math.log2(p))
    terms = pipelined_tree_terms(p, k)
    # (4⌈lg p⌉ + 4k)α + 2(1 + ⌈lg p⌉/k)nβ + (1 + ⌈lg p⌉/k)nγ
    want = (4 * lg + 4 * k) * A + 2 * (1 + lg / k) * N * B + (1 + lg / k) * N * G
    assert close(terms.time_s(N, A, B, G), want)
    assert close(cost_terms("all_reduce", p, "pipelined_tree", segments=k).time_s(N, A, B, G), want)
    assert pipelined_tree_terms(1, k).time_s(N, A, B, G) == 0.0


def test_pipelined_tree_known_value_p4() -> None:
    # p = 4, n = 1 MiB on NET: k* = sqrt(2·2^20·2.25e-9 / 40e-6) = 10.86; k = 11 costs less than 10
    assert best_segments(N, 4, A, B, G) == 11
    want = (8 + 44) * A + 2 * (1 + 2 / 11) * N * B + (1 + 2 / 11) * N * G
    assert close(predict("all_reduce", N, 4, NET, "pipelined_tree"), want)


@pytest.mark.parametrize("p", (2, 3, 8, 100, 8192))
@pytest.mark.parametrize("n", (1, 1000, 1 << 20, 1 << 30))
def test_best_segments_is_the_integer_minimum(p, n) -> None:
    k = best_segments(n, p, A, B, G)
    cost = {j: pipelined_tree_terms(p, j).time_s(n, A, B, G) for j in range(1, 4 * k + 10)}
    assert cost[k] == min(cost.values())
    lg = math.ceil(math.log2(p))
    assert abs(k - math.sqrt(lg * n * (2 * B + G) / (4 * A))) <= 1 or k == 1


def test_pipelined_tree_bandwidth_term_tends_to_the_rings() -> None:
    ib = Network.preset("100Gb-IB")
    n = 1e12  # the fill of the pipeline is negligible: 2nβ remains
    assert 1.0 < predict("all_reduce", n, 1024, ib, "pipelined_tree") / (2 * n * ib.beta) < 1.01
    # 1 GB at scale: unlike the unpipelined binomial tree, as fast as the ring (or faster).
    for p in (64, 1024, 8192):
        pipe = predict("all_reduce", 1e9, p, ib, "pipelined_tree")
        ring = predict("all_reduce", 1e9, p, ib, "ring")
        assert 0.9 < pipe / ring < 1.1
        assert predict("all_reduce", 1e9, p, ib, "tree") > 5 * pipe
    # 1 byte: latency grows like lg p, the ring's like p.
    small = {p: predict("all_reduce", 1, p, ib, "pipelined_tree") for p in (8, 8192)}
    assert close(small[8192], (4 * 13 + 4) * ib.alpha + 2 * 14 * ib.beta)
    assert predict("all_reduce", 1, 8192, ib, "ring") > 100 * small[8192]


def test_pipelined_tree_refuses_what_does_not_apply() -> None:
    with pytest.raises(ValueError, match="segments"):
        cost_terms("all_reduce", 4, "pipelined_tree")
    with pytest.raises(ValueError, match="does not pipeline"):
        cost_terms("all_reduce", 4, "ring", segments=2)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="segments"):
            pipelined_tree_terms(4, bad)
    with pytest.raises(ValueError, match="not linear"):
        crossover_bytes("all_reduce", 8, NET, "pipelined_tree", "ring")
    assert best_segments(0, 8, A, B) == 1 and best_segments(100, 8, 0.0, B) == 100
