"""The memory model against the ZeRO paper's worked example and Table 1, and closed forms."""

from __future__ import annotations

from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal

import pytest
import torch

from labkit import memory
from labkit.models import MLP, count_parameters

# Rajbhandari et al. 2020, Figure 1: Ψ = 7.5B, N_d = 64, K = 12.
WORKED_EXAMPLE = {0: "120", 1: "31.4", 2: "16.6", 3: "1.9"}

# Rajbhandari et al. 2020, Table 1: per-device memory (GB) of P_os, P_os+g, P_os+g+p
# (stages 1, 2, 3), as printed.
PAPER_TABLE_1 = {
    7.5e9: {
        1: ("120", "120", "120"),
        4: ("52.5", "41.3", "30"),
        16: ("35.6", "21.6", "7.5"),
        64: ("31.4", "16.6", "1.88"),
        256: ("30.4", "15.4", "0.47"),
        1024: ("30.1", "15.1", "0.12"),
    },
    128e9: {
        1: ("2048", "2048", "2048"),
        4: ("896", "704", "512"),
        16: ("608", "368", "128"),
        64: ("536", "284", "32"),
        256: ("518", "263", "8"),
        1024: ("513", "257", "2"),
    },
    1e12: {
        1: ("16000", "16000", "16000"),
        4: ("7000", "5500", "4000"),
        16: ("4750", "2875", "1000"),
        64: ("4187", "2218", "250"),
        256: ("4046", "2054", "62.5"),
        1024: ("4011", "2013", "15.6"),
    },
}
CELLS = [
    (psi, nd, stage, shown)
    for psi, rows in PAPER_TABLE_1.items()
    for nd, cells in rows.items()
    for stage, shown in zip((1, 2, 3), cells, strict=True)
]


def printed_as(value: float, shown: str) -> bool:
    """Whether ``shown`` is how the paper prints ``value`` (GB) at the digits it shows.

    Table 1 rounds values under 100 GB half up (41.25 → 41.3, 1.875 → 1.88, 15.625 → 15.6)
    and cuts values of 100 GB or more to whole GB (513.5 → 513, 4187.5 → 4187).
    """
    quantum = Decimal(1).scaleb(Decimal(shown).as_tuple().exponent)
    mode = ROUND_DOWN if value >= 100 else ROUND_HALF_UP
    return Decimal(repr(value)).quantize(quantum, mode) == Decimal(shown)


@pytest.mark.parametrize("stage", memory.STAGES)
def test_worked_example_of_figure_1(stage):
    gb = memory.zero_memory(7.5e9, 64, stage).total_gb
    assert printed_as(gb, WORKED_EXAMPLE[stage]), (stage, gb)


def test_worked_example_exact_values():
    got = [memory.zero_memory(7.5e9, 64, s).total_gb for s in memory.STAGES]
    assert got == pytest.approx([120.0, 31.40625, 16.640625, 1.875], rel=1e-12)


@pytest.mark.parametrize(("psi", "nd", "stage", "shown"), CELLS)
def test_every_cell_of_table_1(psi, nd, stage, shown):
    gb = memory.per_device_bytes(psi, nd, stage) / memory.GB
    assert printed_as(gb, shown), (psi, nd, stage, gb, shown)


def test_table_1_cells_are_not_all_rounded_alike():
    # Cut, not rounded (so printed_as needs both modes)
    assert memory.per_device_bytes(128e9, 1024, 1) / memory.GB == 513.5
    assert memory.per_device_bytes(128e9, 1024, 2) / memory.GB == 257.75
    assert memory.per_device_bytes(1e12, 64, 2) / memory.GB == 2218.75
    assert memory.per_device_bytes(7.5e9, 4, 2) / memory.GB == 41.25  # printed 41.3


@pytest.mark.parametrize(("psi", "nd", "stage", "shown"), CELLS)
def test_a_cell_off_by_one_printed_digit_fails(psi, nd, stage, shown):
    gb = memory.per_device_bytes(psi, nd, stage) / memory.GB
    unit = Decimal(1).scaleb(Decimal(shown).as_tuple().exponent)
    for wrong in (Decimal(shown) + unit, Decimal(shown) - unit):
        assert not printed_as(gb, str(wrong))


def test_gpt2_needs_24_gb():
    # ZeRO §3.1: a 1.5B-parameter GPT-2 needs at least 24 GB for its model states.
    assert memory.zero_memory(1.5e9, 1, 0).total_gb == pytest.approx(24.0)


@pytest.mark.parametrize("nd", [1, 2, 3, 8, 1000])
@pytest.mark.parametrize("k", [12, 8, 0])
def test_closed_forms(nd, k):
    psi = 3.0e9
    b = [memory.zero_memory(psi, nd, s, optimizer_bytes=k) for s in memory.STAGES]
    assert b[0].total_bytes == pytest.approx((2 + 2 + k) * psi)
    assert b[1].total_bytes == pytest.approx(2 * psi + 2 * psi + k * psi / nd)
    assert b[2].total_bytes == pytest.approx(2 * psi + (2 + k) * psi / nd)
    assert b[3].total_bytes == pytest.approx((2 + 2 + k) * psi / nd)
    assert b[2].params_bytes == 2 * psi and b[2].grads_bytes == pytest.approx(2 * psi / nd)


def test_dp_one_is_the_baseline_for_every_stage():
    totals = {memory.per_device_bytes(1e9, 1, s) for s in memory.STAGES}
    assert totals == {16e9}


def test_large_dp_limits():
    # N_d → ∞: P_os tends to 4Ψ (4x less than 16Ψ), P_os+g to 2Ψ (8x), P_os+g+p to 0.
    psi, nd = 1e9, 10**9
    assert memory.per_device_bytes(psi, nd, 1) == pytest.approx(4 * psi, rel=1e-6)
    assert memory.per_device_bytes(psi, nd, 2) == pytest.approx(2 * psi, rel=1e-6)
    assert memory.per_device_bytes(psi, nd, 3) < 1e-6 * psi


def test_monotonic_in_stage_dp_and_size():
    for psi in memory.MODEL_SIZES:
        for nd in memory.DP_DEGREES:
            per_stage = [memory.per_device_bytes(psi, nd, s) for s in memory.STAGES]
            if nd == 1:
                assert len(set(per_stage)) == 1
            else:
                assert per_stage == sorted(per_stage, reverse=True)
                assert len(set(per_stage)) == 4
        for s in (1, 2, 3):
            per_dp = [memory.per_device_bytes(psi, nd, s) for nd in memory.DP_DEGREES]
            assert per_dp == sorted(per_dp, reverse=True)
    for s in memory.STAGES:
        per_size = [memory.per_device_bytes(psi, 64, s) for psi in memory.MODEL_SIZES]
        assert per_size == sorted(per_size)


def test_table_rows():
    rows = memory.table()
    assert len(rows) == len(memory.MODEL_SIZES) * len(memory.DP_DEGREES) * len(memory.STAGES)
    assert rows[0]["n_params"] == 1.5e9 and rows[-1]["n_params"] == 1e12
    assert {r["dp_degree"] for r in rows} == set(memory.DP_DEGREES)
    for r in rows:
        b = memory.zero_memory(r["n_params"], r["dp_degree"], r["stage"])
        assert r["total_gb"] == pytest.approx(b.total_gb)
        assert r["total_gb"] == pytest.approx(r["params_gb"] + r["grads_gb"] + r["optimizer_gb"])
        assert r["stage_name"] == memory.STAGE_NAMES[r["stage"]]
    row = next(r for r in rows if r["n_params"] == 1e12 and r["dp_degree"] == 1024)
    assert row["stage"] == 0 and row["total_gb"] == pytest.approx(16000)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 4, 1), "n_params"),
        ((-1e9, 4, 1), "n_params"),
        ((float("inf"), 4, 1), "n_params"),
        ((1e9, 0, 1), "dp_degree"),
        ((1e9, 2.0, 1), "dp_degree"),
        ((1e9, True, 1), "dp_degree"),
        ((1e9, 4, 4), "stage"),
        ((1e9, 4, -1), "stage"),
        ((1e9, 4, "1"), "stage"),
    ],
)
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        memory.zero_memory(*args)


def test_bad_byte_counts():
    with pytest.raises(ValueError, match="optimizer_bytes"):
        memory.zero_memory(1e9, 4, 1, optimizer_bytes=-1)
    with pytest.raises(ValueError, match="param_bytes"):
        memory.zero_memory(1e9, 4, 1, param_bytes="2")


# Korthikanti et al. 2022, Table 2, on GPT-3-like sizes.
S, B, H, A = 2048, 1, 12288, 96


def test_activation_no_parallelism():
    got = memory.activation_bytes_per_layer(S, B, H, A)
    assert got == pytest.approx(S * B * H * (34 + 5 * A * S / H))


@pytest.mark.parametrize("t", [1, 2, 8])
def test_activation_table_2(t):
    f = memory.activation_bytes_per_layer
    sbh = S * B * H
    assert f(S, B, H, A, tensor_parallel=t) == pytest.approx(
        sbh * (10 + 24 / t + 5 * A * S / (H * t))
    )
    assert f(S, B, H, A, tensor_parallel=t, sequence_parallel=True) == pytest.approx(
        sbh / t * (34 + 5 * A * S / H)
    )
    assert f(S, B, H, A, tensor_parallel=t, recompute="selective") == pytest.approx(
        sbh * (10 + 24 / t)
    )
    sel_sp = f(S, B, H, A, tensor_parallel=t, sequence_parallel=True, recompute="selective")
    assert sel_sp == pytest.approx(sbh * 34 / t)
    assert f(S, B, H, A, tensor_parallel=t, recompute="full") == pytest.approx(2 * sbh)


def test_activation_order_and_errors():
    f = memory.activation_bytes_per_layer
    kinds = [
        f(S, B, H, A, tensor_parallel=8),
        f(S, B, H, A, tensor_parallel=8, sequence_parallel=True),
        f(S, B, H, A, tensor_parallel=8, sequence_parallel=True, recompute="selective"),
        f(S, B, H, A, tensor_parallel=8, recompute="full"),
    ]
    assert kinds == sorted(kinds, reverse=True)
    with pytest.raises(ValueError, match="recompute"):
        f(S, B, H, A, recompute="some")
    with pytest.raises(ValueError, match="hidden"):
        f(S, B, 0, A)


def test_zero_rank_bytes_fp32_module():
    model = MLP(in_features=64, hidden=(128, 64), out_features=10)
    n = count_parameters(model)
    shard = -(-n // 3)
    b = [memory.zero_rank_bytes(model, 3, s) for s in memory.STAGES]
    # fp32 parameters: no master copy, Adam's two fp32 states: K = 8.
    assert b[0].total_bytes == (4 + 4 + 8) * n
    assert (b[1].params_bytes, b[1].grads_bytes, b[1].optimizer_bytes) == (4 * n, 4 * n, 8 * shard)
    assert (b[2].params_bytes, b[2].grads_bytes) == (4 * n, 4 * shard)
    assert b[3].total_bytes == 16 * shard
    assert b[3].n_params == n


def test_zero_rank_bytes_matches_real_tensors():
    # The shard sizes are what torch allocates for a padded flat buffer split in N_d pieces.
    model = MLP(in_features=5, hidden=(7,), out_features=3)  # 5·7+7+7·3+3 = 66 parameters
    n = count_parameters(model)
    for nd in (1, 2, 4, 5, 7):
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        padded = torch.nn.functional.pad(flat, (0, -n % nd))
        mine = padded.chunk(nd)[0]
        optim = {"exp_avg": torch.zeros_like(mine), "exp_avg_sq": torch.zeros_like(mine)}
        held = sum(t.numel() * t.element_size() for t in optim.values())
        assert memory.zero_rank_bytes(model, nd, 1).optimizer_bytes == held
        b3 = memory.zero_rank_bytes(model, nd, 3)
        assert b3.params_bytes == mine.numel() * mine.element_size()


def test_zero_rank_bytes_mixed_precision_is_the_paper_formula():
    model = MLP(in_features=64, hidden=(64,), out_features=64)
    n = count_parameters(model)
    nd = 4 if n % 4 == 0 else 1
    for s in memory.STAGES:
        got = memory.zero_rank_bytes(model, nd, s, param_dtype=torch.float16).total_bytes
        assert got == pytest.approx(memory.per_device_bytes(n, nd, s))


def test_zero_rank_bytes_per_parameter_padding_and_errors():
    model = MLP(in_features=5, hidden=(7,), out_features=3)
    sizes = [p.numel() for p in model.parameters()]  # 35, 7, 21, 3
    per_param = memory.zero_rank_bytes(model, 4, 3, padding="per_parameter")
    assert per_param.params_bytes == 4 * sum(-(-s // 4) for s in sizes)
    assert per_param.params_bytes > memory.zero_rank_bytes(model, 4, 3).params_bytes
    with pytest.raises(ValueError, match="padding"):
        memory.zero_rank_bytes(model, 4, 3, padding="none")
    with pytest.raises(ValueError, match="stage"):
        memory.zero_rank_bytes(model, 4, 5)
    with pytest.raises(TypeError, match="dtype"):
        memory.zero_rank_bytes(model, 4, 1, param_dtype="fp16")
    frozen = MLP(in_features=5, hidden=(7,), out_features=3).requires_grad_(False)
    with pytest.raises(ValueError, match="trainable"):
        memory.zero_rank_bytes(frozen, 2, 1)
