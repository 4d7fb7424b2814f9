"""The planner's three predictions for one configuration: memory, time, why it cannot run.

Introduced in notebooks/18_hybrid_parallel.ipynb, through ``labkit.planner.plan``, whose
module docstring states the model; each function here is one part of it and is tested on
its own (tests/test_planner.py). Pure arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from labkit.costmodel import Network, predict
from labkit.memory import ADAM_MIXED_K, GB, zero_memory
from labkit.parallel.dims import AXES, ParallelDims
from labkit.plan_recompute import recompute_activation_bytes, recompute_flops, recompute_reason

if TYPE_CHECKING:
    from labkit.plan_specs import DeviceSpec, ModelSpec

__all__ = [
    "MemoryEstimate",
    "TimeEstimate",
    "axis_networks",
    "bytes_per_param",
    "cannot_run",
    "dp_comm",
    "memory_estimate",
    "time_estimate",
]


def axis_networks(
    dims: ParallelDims, devices: DeviceSpec, network: Network, intra: Network | None
) -> dict[str, Network]:
    """The network each axis's groups use: ``intra`` for an axis whose every group lies in one
    node of ``devices.per_node`` consecutive ranks (``ParallelDims.nodes_spanned``), else
    ``network``."""
    if intra is None or devices.per_node is None:
        return dict.fromkeys(AXES, network)
    one_node = {a: dims.nodes_spanned(a, devices.per_node) == 1 for a in AXES}
    return {a: intra if inside else network for a, inside in one_node.items()}


def bytes_per_param(model: ModelSpec, mixed: bool) -> tuple[int, float]:
    """(bytes of a working weight, gradient or activation; Adam's K bytes per parameter)."""
    if mixed:
        return 2, ADAM_MIXED_K  # 16-bit weights; fp32 master, m and v (ZeRO's K = 12)
    return model.bytes_per_param, 2 * model.bytes_per_param  # Adam's m and v


@dataclass(frozen=True)
class MemoryEstimate:
    """``memory_estimate``'s result: the bytes per device and the quantities behind them."""

    total: float
    breakdown: dict[str, float]
    microbatch_size: int
    params_per_device: float
    reasons: list[str]


def memory_estimate(
    model: ModelSpec, dims: ParallelDims, stage: int, m: int, mixed: bool, recompute: str = "none"
) -> MemoryEstimate:
    """Predicted peak bytes on one device: ZeRO's model states plus the activations in flight.

    Model states: ``labkit.memory.zero_memory`` of the Ψ/(pp·tp) parameters a device holds,
    sharded over dp (Rajbhandari et al. 2020, §5). Activations: Korthikanti et al. 2022's
    bytes per layer (with t = tp, scaled from their 16-bit count to the working precision)
    × L/pp layers × min(pp, m) micro-batches in flight (1F1B's bound on the first stage,
    Narayanan et al. 2021, §2.1; with pp = 1 the micro-batches are accumulation steps),
    under the ``recompute`` mode, plus one layer's rebuilt activations when it recomputes
    (``labkit.plan_recompute``).

    Args:
        model: the model; ``dims`` and ``m`` must obey ``cannot_run``'s divisibility rules.
        dims: the grid.
        stage: the ZeRO stage over dp.
        m: micro-batches per step.
        mixed: mixed precision (see ``plan``).
        recompute: activation recomputation, ``"none"``, ``"selective"`` or ``"full"``.

    Returns:
        A ``MemoryEstimate``: total bytes, the params/grads/optimizer/activations breakdown, b, the
        parameters per device, and the two reasons lines that explain them.
    """
    pb, k = bytes_per_param(model, mixed)
    psi = model.n_params / (dims.pp * dims.tp)
    states = zero_memory(psi, dims.dp, stage, param_bytes=pb, grad_bytes=pb, optimizer_bytes=k)
    b = model.batch // (dims.dp * m)
    in_flight, layers = min(dims.pp, m), model.n_layers // dims.pp
    per_layer, rebuilt = recompute_activation_bytes(model, b, dims.tp, recompute, pb)
    acts = per_layer * layers * in_flight + rebuilt
    total = states.total_bytes + acts
    reasons = [
        f"b = B/(dp·m) = {model.batch}/({dims.dp}·{m}) = {b} sequences per micro-batch; "
        f"{psi:,.4g} parameters per device (Ψ/(pp·tp))",
        f"memory {total / GB:.4g} GB = params {states.params_bytes / GB:.4g} + grads "
        f"{states.grads_bytes / GB:.4g} + optimizer {states.optimizer_bytes / GB:.4g} "
        f"(ZeRO-{stage} over dp={dims.dp}) + activations {acts / GB:.4g} ({layers} layers × "
        f"{in_flight} micro-batch(es) in flight × {per_layer / GB:.4g} GB"
        + (
            f" + {rebuilt / GB:.4g} GB one layer rebuilds: {recompute} recompute)"
            if rebuilt
            else ")"
        ),
    ]
    breakdown = {
        "params": states.params_bytes,
        "grads": states.grads_bytes,
        "optimizer": states.optimizer_bytes,
        "activations": acts,
    }
    return MemoryEstimate(total, breakdown, b, psi, reasons)


@dataclass(frozen=True)
class TimeEstimate:
    """``time_estimate``'s result: the parts of one step's seconds and the lines explaining them."""

    compute: float
    bubble: float
    comm: dict[str, float]
    reasons: list[str]
    recompute: float = 0.0  # seconds of recomputed forward (labkit.plan_recompute)

    @property
    def step(self) -> float:
        return self.compute + self.recompute + self.bubble + sum(self.comm.values())


def time_estimate(
    model: ModelSpec,
    devices: DeviceSpec,
    nets: dict[str, Network],
    dims: ParallelDims,
    stage: int,
    m: int,
    mixed: bool,
    tp_ar: int,
    recompute: str = "none",
) -> TimeEstimate:
    """Predicted seconds of one optimizer step: compute, pipeline bubble, communication.

    Compute: 6Ψ·B·s FLOPs (Kaplan et al. 2020, §2.1) spread evenly over the devices. Bubble:
    (pp − 1)/m of it (GPipe, Huang et al. 2019, §2.3). Communication, not overlapped (an
    upper bound): ``dp_comm`` over dp, ``tp_ar`` all-reduces of b·s·h per layer and
    micro-batch over tp (Shoeybi et al. 2019, §3), and 2m point-to-point b·s·h messages per
    device over pp, each priced by ``labkit.costmodel`` on its axis's network. Recomputation
    adds ``labkit.plan_recompute.recompute_flops`` spread over the devices, and lengthens the
    bubble with the stages it lengthens.

    Args:
        model, devices: the specs; ``dims`` and ``m`` must obey the divisibility rules.
        nets: the network of each axis (``axis_networks``).
        dims: the grid.
        stage: the ZeRO stage over dp.
        m: micro-batches per step.
        mixed: mixed precision (see ``plan``).
        tp_ar: all-reduces per layer and micro-batch under tensor parallelism.
        recompute: activation recomputation, ``"none"``, ``"selective"`` or ``"full"``.

    Returns:
        A ``TimeEstimate``: compute, bubble, per-axis communication and recompute seconds,
        and six reasons lines (seven with recomputation).
    """
    dp, pp, tp = dims.dp, dims.pp, dims.tp
    pb, _ = bytes_per_param(model, mixed)
    psi = model.n_params / (pp * tp)
    b, layers = model.batch // (dp * m), model.n_layers // pp
    compute = 6 * model.n_params * model.batch * model.seq_len / (devices.count * devices.flops)
    again = recompute_flops(model, recompute) / (devices.count * devices.flops)
    bubble = (compute + again) * (pp - 1) / m
    dp_s, dp_how = dp_comm(stage, m, pb * psi, dp, nets["dp"])
    act_msg = pb * b * model.seq_len * model.hidden  # one b·s·h activation
    tp_s = m * layers * tp_ar * predict("all_reduce", act_msg, tp, nets["tp"])
    pp_s = 2 * m * nets["pp"].p2p_time_s(act_msg) if pp > 1 else 0.0
    comm = dp_s + tp_s + pp_s
    reasons = [
        f"compute 6·Ψ·B·s / (devices·FLOP/s) = {compute:.4g} s",
        *([recompute_reason(recompute, again)] if recompute != "none" else []),
        f"bubble (pp−1)/m · compute = {pp - 1}/{m} · {compute + again:.4g} = {bubble:.4g} s"
        if pp > 1
        else f"m = {m}: accumulation steps, one micro-batch's activations at a time",
        f"dp: {dp_how} of {pb * psi:,.0f} B over {dp} ranks = {dp_s:.4g} s",
        f"tp: {m}·{layers}·{tp_ar} all-reduces of {act_msg:,.0f} B over {tp} ranks = {tp_s:.4g} s"
        if tp > 1
        else "tp = 1: no tensor-parallel all-reduces",
        f"pp: 2·{m} p2p messages of {act_msg:,.0f} B = {pp_s:.4g} s"
        if pp > 1
        else "pp = 1: no pipeline messages, no bubble",
        f"step {compute + again + bubble + comm:.4g} s = compute"
        + (" + recompute" if recompute != "none" else "")
        + f" + bubble + comm ({comm:.4g} s, not overlapped)",
    ]
    return TimeEstimate(compute, bubble, {"dp": dp_s, "tp": tp_s, "pp": pp_s}, reasons, again)


def cannot_run(
    model: ModelSpec,
    devices: DeviceSpec,
    dims: ParallelDims,
    m: int,
    memory_bytes: float | None = None,
) -> list[str]:
    """The reasons a plan cannot run, one line each (empty: it can).

    The divisibility rules: pp divides the layers, tp divides the width and the heads, dp·m
    divides the batch (a plan breaking one has no memory or time to predict). With
    ``memory_bytes`` given, also whether it fits in one device's memory.

    Args:
        model, devices: the specs.
        dims: the grid.
        m: micro-batches per step.
        memory_bytes: the predicted bytes per device (``memory_estimate``), or None.

    Returns:
        The lines, divisibility first.
    """
    dp, pp, tp = dims.dp, dims.pp, dims.tp
    fails = []
    if model.n_layers % pp:
        fails.append(f"pp={pp} does not divide n_layers={model.n_layers}")
    if model.hidden % tp:
        fails.append(f"tp={tp} does not divide hidden={model.hidden}")
    if model.n_heads % tp:
        fails.append(f"tp={tp} does not divide n_heads={model.n_heads}")
    if model.batch % (dp * m):
        fails.append(f"batch={model.batch} is not divisible by dp·m = {dp}·{m} = {dp * m}")
    if memory_bytes is not None and memory_bytes > devices.memory_bytes:
        fails.append(
            f"does not fit: memory over budget by "
            f"{(memory_bytes - devices.memory_bytes) / GB:.4g} GB "
            f"({memory_bytes / GB:.4g} GB > {devices.memory_bytes / GB:.4g} GB)"
        )
    return fails


# Per ZeRO stage: (all-reduces, reduce-scatters, all-gathers) of the dp shard's gradient or
# parameter bytes per step, with m micro-batches. Stage 1 reduce-scatters once, after the last
# micro-batch, and all-gathers the updated parameters; stage 2 keeps only its gradient shard,
# so it reduce-scatters after every micro-batch; stage 3 also gathers the parameters for each
# micro-batch's forward and backward (ZeRO, Rajbhandari et al. 2020, §7.2: 2Ψ for stages 0-2,
# 3Ψ for stage 3 with m = 1).
def dp_comm(stage: int, m: int, n_bytes: float, dp: int, net: Network) -> tuple[float, str]:
    counts = {0: (1, 0, 0), 1: (0, 1, 1), 2: (0, m, 1), 3: (0, m, 2 * m)}[stage]
    names = ("all_reduce", "reduce_scatter", "all_gather")
    t = sum(k * predict(c, n_bytes, dp, net) for k, c in zip(counts, names, strict=True) if k)
    how = " + ".join(f"{k} {c.replace('_', '-')}" for k, c in zip(counts, names, strict=True) if k)
    return t, how
