"""A strategy planner: every (dp, pp, tp, ZeRO stage, micro-batches, recompute) with its memory
and step time.

Introduced in notebooks/18_hybrid_parallel.ipynb.

Pure arithmetic on top of ``labkit.memory`` (model states per ZeRO stage, activations per
layer) and ``labkit.costmodel`` (the α-β time of each collective): no processes, no
torch.distributed, so a widget or a test gets a whole table instantly::

    gpt = ModelSpec(n_params=7 * 10**9, n_layers=32, hidden=4096, seq_len=2048, batch=64)
    best = plan(gpt, DeviceSpec(8, 80e9, 300e12), lk.Network.preset("NVLink"))[0]
    print(best.label, best.step_s, *best.reasons, sep="\\n")

The model of one training step on ``count = dp·pp·tp`` devices, m micro-batches of b = B/(dp·m)
sequences, with Ψ parameters, L layers, width h and sequence length s:

- memory: ZeRO's model states of the Ψ/(pp·tp) parameters a device holds, sharded over dp
  (Rajbhandari et al. 2020, §5), plus activations: Korthikanti et al. 2022's bytes per layer
  (with t = tp) × L/pp layers × min(pp, m) micro-batches in flight (1F1B, Narayanan et al.
  2021, §2.1; with pp = 1 the micro-batches are accumulation steps, one at a time);
- compute: 6Ψ·B·s FLOPs per step (forward 2Ψ, backward 4Ψ per token: Kaplan et al. 2020,
  §2.1) spread evenly over the devices;
- bubble: (pp − 1)/m of the compute time (GPipe, Huang et al. 2019, §2.3: the bubble is
  (p − 1)/(m + p − 1) of the step);
- activation recomputation, when ``plan(..., recompute=...)`` offers it (notebook 14,
  ``labkit.plan_recompute``): "selective" or "full" keeps Korthikanti et al.'s sbh·34 or 2sbh
  per layer (plus one layer's rebuilt tensors) and adds the attention cores (4·B·s²·h·L) or
  one more forward (2Ψ·B·s) to the compute;
- communication, not overlapped with compute (an upper bound): the gradient all-reduce over
  dp (ZeRO-1: reduce-scatter + all-gather; ZeRO-2: a reduce-scatter per micro-batch; ZeRO-3
  adds two parameter all-gathers per micro-batch, ZeRO §7.2), Megatron's 2 + 2 all-reduces
  of b·s·h activations per layer over tp (Shoeybi et al. 2019, §3), and pp's point-to-point
  activations and gradients (2m messages of b·s·h per device).

With a calibrated ``MachineModel`` and the model's ``Workload`` (``plan(...,
calibrated=Calibrated(machine, workload, backend))``, notebook 21) the step time is instead
``labkit.plan_time.step_time``: what labkit's implementations do on that machine (per-unit
ZeRO/FSDP2 collectives, DDP's buckets, Megatron's per-layer all-reduces, 1F1B played through
with its hops, Adam and the step's Python), each collective priced by the calibrated model;
the memory model is the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from labkit.costmodel import MachineModel, Network
from labkit.memory import STAGES
from labkit.parallel.dims import ParallelDims
from labkit.plan_estimates import axis_networks, cannot_run, memory_estimate, time_estimate
from labkit.plan_recompute import RECOMPUTE_MODES, recompute_label
from labkit.plan_specs import DeviceSpec, ModelSpec, PlanError, _positive_int
from labkit.plan_time import StepTime, collective_counts, framework_time, step_time
from labkit.plan_workload import LayerCost, Workload, transformer_workload

__all__ = [
    "Calibrated",
    "DeviceSpec",
    "LayerCost",
    "ModelSpec",
    "Plan",
    "PlanError",
    "StepTime",
    "Workload",
    "collective_counts",
    "framework_time",
    "plan",
    "step_time",
    "transformer_workload",
]


@dataclass(frozen=True)
class Calibrated:
    """What ``plan`` needs to price steps with the calibrated model instead of the textbook's.

    Attributes:
        machine: the ``MachineModel`` (``lk.bench.calibrate``).
        workload: the model's ``Workload`` (``lk.bench.workload_from_model``).
        backend: the backend the ranks will use (a name in ``machine.backends``).
    """

    machine: MachineModel
    workload: Workload
    backend: str


@dataclass(frozen=True)
class Plan:
    """One configuration and what the model predicts for it.

    Attributes:
        dp, pp, tp: the parallel degrees (dp·pp·tp = the device count).
        zero_stage: ZeRO stage over the dp axis (0: plain data parallelism).
        microbatches: m, micro-batches per step (pipeline micro-batches, or accumulation
            steps when pp = 1).
        memory_bytes: predicted peak bytes per device (model states + activations).
        step_s: compute_s + bubble_s + comm_s, seconds per optimizer step.
        compute_s, comm_s, bubble_s: the parts of ``step_s``.
        feasible: fits in memory and obeys the divisibility rules.
        reasons: human-readable lines explaining each number, and why it fails if it does.
        breakdown: memory parts in bytes: params, grads, optimizer, activations.
        comm: ``comm_s`` split by axis: dp, tp, pp (seconds).
        microbatch_size: b = B/(dp·m) sequences (0 when B is not divisible by dp·m).
        recompute: activation recomputation: ``"none"``, ``"selective"`` or ``"full"``.
        recompute_s: the part of ``step_s`` spent recomputing activations.
        step: the calibrated model's ``StepTime`` (None with the textbook model).
    """

    dp: int
    pp: int
    tp: int
    zero_stage: int
    microbatches: int
    memory_bytes: float
    step_s: float
    compute_s: float
    comm_s: float
    bubble_s: float
    feasible: bool
    reasons: list[str]
    breakdown: dict[str, float]
    comm: dict[str, float] = field(default_factory=dict)
    microbatch_size: int = 0
    recompute: str = "none"
    recompute_s: float = 0.0
    step: StepTime | None = None

    @property
    def label(self) -> str:
        """``"dp2·pp1·tp2·zero1·m1"``, and ``"·ac-selective"`` / ``"·ac-full"`` when it
        recomputes activations."""
        dims = ParallelDims(self.dp, self.pp, self.tp)
        ac = recompute_label(self.recompute)
        return f"{dims.label}·zero{self.zero_stage}·m{self.microbatches}{ac}"


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _factorizations(count: int) -> list[ParallelDims]:
    """Every grid dp × pp × tp of ``count`` ranks."""
    return [
        ParallelDims(count // (pp * tp), pp, tp)
        for pp in _divisors(count)
        for tp in _divisors(count // pp)
    ]


def _one_plan(
    model: ModelSpec,
    devices: DeviceSpec,
    nets: dict[str, Network],
    dims: ParallelDims,
    stage: int,
    m: int,
    mixed: bool,
    tp_ar: int,
    recompute: str = "none",
    calibrated: Calibrated | None = None,
) -> Plan:
    """The ``Plan`` of one (grid, ZeRO stage, m, recompute), from ``labkit.plan_estimates``'s
    ``memory_estimate``, ``time_estimate`` and ``cannot_run``."""
    grid = {"dp": dims.dp, "pp": dims.pp, "tp": dims.tp, "zero_stage": stage, "microbatches": m}
    grid["recompute"] = recompute
    broken = cannot_run(model, devices, dims, m)
    if broken:
        nan = math.nan
        return Plan(
            **grid,
            memory_bytes=nan,
            step_s=nan,
            compute_s=nan,
            comm_s=nan,
            bubble_s=nan,
            feasible=False,
            reasons=[f"infeasible: {f}" for f in broken],
            breakdown=dict.fromkeys(("params", "grads", "optimizer", "activations"), nan),
        )
    mem = memory_estimate(model, dims, stage, m, mixed, recompute)
    time = time_estimate(model, devices, nets, dims, stage, m, mixed, tp_ar, recompute)
    over = cannot_run(model, devices, dims, m, mem.total)
    if calibrated is not None:
        c, zero = calibrated, stage if dims.dp > 1 else 0
        st = step_time(c.workload, c.machine, c.backend, dims, zero, zero == 3 and dims.tp > 1, m)
        # recomputation: the same share of the compute as its FLOPs are of the textbook's
        again = st.compute_s * time.recompute / time.compute if time.compute else 0.0
        return Plan(
            **grid,
            memory_bytes=mem.total,
            step_s=st.step_s + again,
            compute_s=st.compute_s,
            comm_s=st.step_s - st.compute_s - st.bubble_s,
            bubble_s=st.bubble_s,
            feasible=not over,
            reasons=[*mem.reasons, *st.reasons, f"step {st.step_s + again:.4g} s", *over],
            breakdown=mem.breakdown,
            comm=st.comm,
            microbatch_size=mem.microbatch_size,
            recompute_s=again,
            step=st,
        )
    return Plan(
        **grid,
        memory_bytes=mem.total,
        step_s=time.step,
        compute_s=time.compute,
        comm_s=sum(time.comm.values()),
        bubble_s=time.bubble,
        feasible=not over,
        reasons=[*mem.reasons, *time.reasons, *over],
        breakdown=mem.breakdown,
        comm=time.comm,
        microbatch_size=mem.microbatch_size,
        recompute_s=time.recompute,
    )


def plan(
    model: ModelSpec,
    devices: DeviceSpec,
    network: Network,
    *,
    zero_stages: tuple[int, ...] = (0, 1, 2, 3),
    max_microbatches: int | None = None,
    mixed_precision: bool = False,
    intra_node: Network | None = None,
    tp_all_reduces_per_layer: int = 4,
    recompute: tuple[str, ...] = ("none",),
    calibrated: Calibrated | None = None,
) -> list[Plan]:
    """Every (dp, pp, tp, ZeRO stage, micro-batches, recompute) for ``devices.count`` devices,
    best first.

    The model of memory and time is this module's docstring. Micro-batch counts tried: the divisors
    m of B/dp (at most ``max_microbatches``); a dp that does not divide B gives one infeasible row
    with m = 1.

    Args:
        model: the ``ModelSpec``.
        devices: the ``DeviceSpec``.
        network: the network every axis communicates over (``lk.Network``).
        zero_stages: ZeRO stages to try over the dp axis.
        max_microbatches: the largest m to try (None: every divisor of B/dp).
        mixed_precision: 16-bit weights, gradients and activations with fp32 master weights
            and Adam states (ZeRO's 2 + 2 + 12 bytes); otherwise ``bytes_per_param`` for all
            and Adam's two states.
        intra_node: a faster network for groups inside one node of ``devices.per_node``
            devices (tp is innermost, then pp, then dp; None: ``network`` everywhere).
        tp_all_reduces_per_layer: b·s·h all-reduces per layer and micro-batch under tensor
            parallelism (4: Megatron's transformer layer; 2: an MLP block alone).
        recompute: activation-recomputation modes to try, a non-empty subset of ``("none",
            "selective", "full")`` (default: none, the planner of notebook 18).
        calibrated: price each step with ``step_time`` on a calibrated machine (this
            module's docstring; recomputation as the textbook's share of the compute);
            None: the textbook model above.

    Returns:
        Feasible plans sorted by ``step_s`` (then memory), then infeasible ones (over memory
        sorted the same way, then those breaking a divisibility rule), each with its reasons.

    Raises:
        PlanError: ``model`` or ``devices`` of the wrong type, no ZeRO stage or an unknown
            one, ``max_microbatches`` < 1, no recompute mode or an unknown one.
    """
    for arg, kind in ((model, ModelSpec), (devices, DeviceSpec), (network, Network)):
        if not isinstance(arg, kind):
            raise PlanError(f"expected a {kind.__name__}, got {type(arg).__name__}: {arg!r}")
    stages = tuple(zero_stages)
    if not stages or any(isinstance(z, bool) or z not in STAGES for z in stages):
        raise PlanError(f"zero_stages must be a non-empty subset of {STAGES}, got {stages!r}")
    if max_microbatches is not None:
        _positive_int("max_microbatches", max_microbatches)
    tp_ar = _positive_int("tp_all_reduces_per_layer", tp_all_reduces_per_layer)
    modes = tuple(dict.fromkeys(recompute)) if not isinstance(recompute, str) else ()
    if not modes or any(r not in RECOMPUTE_MODES for r in modes):
        raise PlanError(
            f"recompute must be a non-empty subset of {RECOMPUTE_MODES}, got {recompute!r}"
        )
    plans = []
    for dims in _factorizations(devices.count):
        nets = axis_networks(dims, devices, network, intra_node)
        if model.batch % dims.dp:
            ms = [1]
        else:
            ms = [m for m in _divisors(model.batch // dims.dp) if m <= (max_microbatches or m)]
        for stage in dict.fromkeys(stages):
            for m in ms:
                for r in modes:
                    args = (model, devices, nets, dims, stage, m, mixed_precision, tp_ar, r)
                    plans.append(_one_plan(*args, calibrated=calibrated))

    def key(p: Plan) -> tuple:
        broken = math.isnan(p.step_s)
        step, mem = (math.inf, math.inf) if broken else (p.step_s, p.memory_bytes)
        ac = RECOMPUTE_MODES.index(p.recompute)
        return (
            not p.feasible,
            broken,
            step,
            mem,
            p.dp,
            p.pp,
            p.tp,
            p.zero_stage,
            p.microbatches,
            ac,
        )

    return sorted(plans, key=key)
