"""The calibrated machine model: recipes read from the backends, terms by hand, presets."""

from __future__ import annotations

import dataclasses
import math

import pytest

from labkit.backends._shm import collectives as shm_algo
from labkit.costmodel import Network, predict
from labkit.costmodel.machine import (
    BackendCosts,
    MachineModel,
    collective_terms,
    predict_collective,
)
from labkit.costmodel.recipes import (
    SHM_ONE_SHOT_BYTES,
    Recipe,
    gloo_ring_messages,
    recipe,
)

MB = 1 << 20
# Round numbers: memcpy 1 ns/B alone, 2 ns/B with 2 ranks, 4 ns/B with 4; a += b 2x that.
COPY = {1: {MB: 1e-9}, 2: {MB: 2e-9}, 4: {MB: 4e-9}}
ADD = {p: {MB: 2 * v[MB]} for p, v in COPY.items()}
GLOO = BackendCosts(
    "gloo",
    "gloo",
    alpha=50e-6,
    beta=0.5e-9,
    duplex=2.0,
    overhead_s={("all_reduce", 2): 100e-6, ("all_gather", 4): 300e-6},
)
SHM = BackendCosts(
    "labkit_shm",
    "labkit_shm",
    alpha=20e-6,
    beta=0.25e-9,
    overhead_s={("all_reduce", 2): 40e-6, ("broadcast", 4): 60e-6},
    round_s={2: 10e-6, 4: 30e-6},
    chunk_bytes={2: MB, 4: 4 * MB},
)
MACHINE = MachineModel(
    cores=2,
    copy_s_per_byte=COPY,
    add_s_per_byte=ADD,
    compute_share={2: 1.0, 4: 2.0},
    backends={"gloo": GLOO, "labkit_shm": SHM},
)


def test_shm_recipes_follow_the_backend_constants():
    assert SHM_ONE_SHOT_BYTES == shm_algo.ONE_SHOT_BYTES
    one_shot = recipe("labkit_shm", "all_reduce", 4, SHM_ONE_SHOT_BYTES)
    two_shot = recipe("labkit_shm", "all_reduce", 4, SHM_ONE_SHOT_BYTES + 1)
    assert (one_shot.copy, one_shot.reduce, one_shot.extra_rounds) == (1, 3, 0)
    # reduce-scatter + all-gather on 4 ranks: 3/4 in, 1/4 back, 3/4 out; 3/4 reduced
    assert (two_shot.copy, two_shot.reduce, two_shot.extra_rounds) == (1.75, 0.75, 1)
    # above 256 KiB every world size splits the work: 2 ranks copy 1/2 in, 1/2 back, 1/2 out
    assert recipe("labkit_shm", "all_reduce", 2, 64 * MB).copy == 1.5
    assert recipe("labkit_shm", "all_reduce", 2, SHM_ONE_SHOT_BYTES).reduce == 1


def test_gloo_recipes_by_hand():
    ar = recipe("gloo", "all_reduce", 4)
    assert (ar.wire, ar.exchange, ar.reduce, ar.copy) == (1.5, True, 0.75, 0)
    rs = recipe("gloo", "reduce_scatter", 4)  # clone + whole all-reduce + copy out
    assert (rs.wire, rs.reduce, rs.copy) == (1.5, 0.75, 1.25)
    ag = recipe("gloo", "all_gather", 2)
    assert (ag.wire, ag.exchange, ag.copy) == (0.5, True, 1.5)
    assert recipe("gloo", "broadcast", 4).wire == 2 and recipe("gloo", "broadcast", 5).wire == 3
    with pytest.raises(ValueError):
        recipe("gloo", "all_to_all", 2)
    with pytest.raises(ValueError):
        recipe("nccl", "all_reduce", 2)
    with pytest.raises(ValueError):
        recipe("gloo", "all_reduce", 1)


def test_gloo_ring_cuts_buffers_into_segments_of_at_most_1_mib():
    # S = max(⌈n / 1 MiB⌉, 2p) rounded up to a multiple of p; 2(S − S/p) messages per rank
    assert gloo_ring_messages(4, 2) == 4 and gloo_ring_messages(64 << 10, 4) == 12
    assert gloo_ring_messages(16 * MB, 2) == 16 and gloo_ring_messages(16 * MB, 4) == 24
    assert gloo_ring_messages(9 * MB, 4) == 18  # 9 segments rounded up to 12
    assert recipe("gloo", "all_reduce", 4, 16 * MB).messages == 24 - 6
    assert recipe("gloo", "reduce_scatter", 2, 64).messages == 2  # its whole all-reduce
    assert recipe("gloo", "all_gather", 4, 16 * MB).messages == 0  # 2(p−1) halves, any size
    assert recipe("gloo", "broadcast", 4, 16 * MB).messages == 0


def test_rounds_count_chunks():
    r = Recipe(chunked=1, extra_rounds=1)
    assert r.rounds(0, MB) == 2 and r.rounds(MB, MB) == 2 and r.rounds(MB + 1, MB) == 3
    assert Recipe().rounds(10 * MB, MB) == 1  # not chunked: one round


def test_gloo_all_reduce_terms_by_hand():
    n = MB
    t = collective_terms(MACHINE, "gloo", "all_reduce", n, 2)
    assert t["overhead"] == 100e-6
    # ring on 2 ranks: 2·(1/2)·n exchanged at β with duplex 2 (β measured with 2 ranks busy)
    assert math.isclose(t["wire"], 1.0 * n * 0.5e-9 * 2.0)
    assert math.isclose(t["reduce"], 0.5 * n * 4e-9)  # (p−1)/p·n at the 2-rank add rate
    assert t["copy"] == 0
    # 4 segments (2p) of 256 KiB: 4 messages where one float's call sends 2(p−1) = 2
    assert math.isclose(t["rounds"], 2 * 50e-6)
    # 4 ranks on 2 cores: two ranks take turns on each core, the wire's time ×2 — not the
    # copies' slow-down from 2 to 4 ranks (here ×3); overhead unmeasured:
    copies_x3 = {**COPY, 4: {MB: 6e-9}}
    t4 = collective_terms(
        dataclasses.replace(MACHINE, copy_s_per_byte=copies_x3), "gloo", "all_reduce", n, 4
    )
    assert math.isclose(t4["wire"], 1.5 * n * 0.5e-9 * 2.0 * 2)
    assert math.isclose(t4["overhead"], 6 * 50e-6)  # 2(p−1) steps of α
    assert math.isclose(t4["rounds"], (12 - 6) * 50e-6 * 2)  # 8 segments: 2·(8 − 2) messages
    assert math.isclose(
        predict_collective(MACHINE, "gloo", "all_reduce", n, 4), sum(t4.values()), rel_tol=1e-12
    )
    assert collective_terms(
        MachineModel(cores=4, backends={"gloo": GLOO}), "gloo", "all_reduce", n, 4
    )["wire"] == pytest.approx(1.5 * n * 0.5e-9 * 2.0)  # a core each


def test_shm_terms_by_hand():
    # 8 chunks of 1 MiB on 2 ranks, split (reduce-scatter + all-gather): one round more than
    # the chunks, 8 beyond the smallest call's one (one-shot); 1/2 in, 1/2 back, 1/2 out
    n = 8 * MB
    t = collective_terms(MACHINE, "labkit_shm", "all_reduce", n, 2)
    assert math.isclose(t["rounds"], 8 * 10e-6)
    assert math.isclose(t["copy"], 1.5 * n * 2e-9) and math.isclose(t["reduce"], 0.5 * n * 4e-9)
    small = collective_terms(MACHINE, "labkit_shm", "all_reduce", 256 << 10, 2)  # one-shot
    assert small["rounds"] == 0 and math.isclose(small["reduce"], (256 << 10) * 4e-9)
    assert t["wire"] == 0
    b = collective_terms(MACHINE, "labkit_shm", "broadcast", n, 4)  # 4 MiB slots: 2 chunks
    assert b["overhead"] == 60e-6 and math.isclose(b["rounds"], 30e-6)
    assert math.isclose(b["copy"], n * 4e-9)


def test_p2p_and_one_rank():
    assert math.isclose(predict_collective(MACHINE, "gloo", "p2p", MB, 2), 50e-6 + MB * 0.5e-9)
    assert predict_collective(MACHINE, "gloo", "all_reduce", MB, 1) == 0
    with pytest.raises(KeyError, match="gloo"):
        predict_collective(MACHINE, "nccl", "all_reduce", MB, 2)
    with pytest.raises(ValueError):
        predict_collective(MACHINE, "gloo", "all_reduce", -1, 2)


def test_rates_interpolate_in_log_size_and_scale_unmeasured_ranks():
    m = MachineModel(cores=2, copy_s_per_byte={2: {MB: 1e-9, 4 * MB: 3e-9}})
    assert m.copy_rate(2, MB) == 1e-9 and m.copy_rate(2, 2 * MB) == pytest.approx(2e-9)
    assert m.copy_rate(2, 64) == 1e-9 and m.copy_rate(2, 64 * MB) == 3e-9  # clamped
    assert m.copy_rate(8, MB) == pytest.approx(4e-9)  # 8 ranks on 2 cores: ×4 over 2 ranks
    assert MACHINE.turns(4, base=2) == 2.0 and MACHINE.turns(2, base=2) == 1.0
    assert MACHINE.turns(8) == 4.0 and MachineModel(cores=16).turns(8, base=2) == 1.0
    assert MACHINE.compute_share_at(4) == 2.0 and MACHINE.compute_share_at(8) == 4.0


def test_from_network_is_the_textbook_model():
    ib = Network.preset("100Gb-IB")
    m = MachineModel.from_network(ib, flops=300e12)
    for op in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
        for p in (2, 8, 1024):
            got = predict_collective(m, ib.name, op, 1e9, p)
            assert math.isclose(got, predict(op, 1e9, p, ib), rel_tol=1e-12)
    assert m.flops == 300e12


def test_validation():
    with pytest.raises(ValueError):
        BackendCosts("x", "mpi", 0, 0)
    with pytest.raises(ValueError):
        BackendCosts("x", "gloo", 0, 0, duplex=0.5)
    with pytest.raises(ValueError):
        MachineModel(cores=0)


def test_labkit_shm_pays_the_hand_off_on_what_it_reads_from_its_peers_slots():
    # 0.05 ns per byte beyond two private copies, measured on 2 ranks only
    shm = dataclasses.replace(SHM, handoff_s={2: 0.05e-9})
    m = dataclasses.replace(MACHINE, backends={"gloo": GLOO, "labkit_shm": shm})
    n, h = 8 * MB, 0.05e-9
    cases = {  # bytes read from peers' slots, per byte of n, on 2 and 4 ranks (nearest: 2's)
        ("all_reduce", 2): 1.0,  # split: the peer's half of my piece, then its reduced piece
        ("all_reduce", 4): 1.5,
        ("all_gather", 4): 0.75,
        ("reduce_scatter", 2): 0.5,
        ("broadcast", 4): 1.0,
    }
    for (op, p), cross in cases.items():
        assert recipe("labkit_shm", op, p, n).cross == cross
        t = collective_terms(m, "labkit_shm", op, n, p)
        assert math.isclose(t["handoff"], cross * n * h)
        base = collective_terms(MACHINE, "labkit_shm", op, n, p)
        assert base["handoff"] == 0  # not measured: nothing added
        assert math.isclose(
            predict_collective(m, "labkit_shm", op, n, p),
            predict_collective(MACHINE, "labkit_shm", op, n, p) + cross * n * h,
        )
    # one-shot: every peer's whole chunk; gloo's bytes go through sockets (β has them)
    small = SHM_ONE_SHOT_BYTES
    assert collective_terms(m, "labkit_shm", "all_reduce", small, 4)["handoff"] == pytest.approx(
        3 * small * h
    )
    assert recipe("gloo", "all_reduce", 4, n).cross == 0
    assert collective_terms(MACHINE, "gloo", "all_reduce", n, 4)["handoff"] == 0
    # the nearest measured world size, the smaller on a tie
    two_four = dataclasses.replace(SHM, handoff_s={2: 1e-9, 4: 3e-9})
    assert [two_four.handoff(p) for p in (2, 3, 4, 8)] == [1e-9, 1e-9, 3e-9, 3e-9]
    assert SHM.handoff(4) == 0.0
