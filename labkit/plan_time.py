"""The step time of a strategy as labkit's implementations run it, on a calibrated machine.

Introduced in notebooks/21_capstone.ipynb.

``step_time`` prices one optimizer step of a ``Workload`` under (dp, pp, tp, ZeRO stage or
FSDP2, m micro-batches) with a ``MachineModel``, term by term, each term what the code does:

- **compute**: every layer's calibrated forward and backward (a + c·N for N tokens of a
  micro-batch, b = B/(dp·m) sequences), a block's per-token part split over tp; times the
  machine's compute sharing when more ranks than cores compute at once;
- **tp**: Megatron's operators, one all-reduce of N·h elements per row-parallel layer in
  forward and per column-parallel layer in backward (``labkit.parallel.tensor.comm``: q, k
  and v each have their own ``f``: 6 per TinyGPT block), on the tp group, blocking;
- **ZeRO / FSDP2, per unit** (``labkit.parallel.zero``): stage 1 reduce-scatters every unit
  after backward and all-gathers it after Adam; stage 2 reduce-scatters each unit inside the
  last backward and all-gathers after Adam; stage 3 and FSDP2 all-gather each unit before its
  forward and again before its backward in every micro-batch, and reduce-scatter it in the
  last backward — each call a blocking collective of the unit's padded size;
- **DDP**: one all-reduce per bucket (labkit's ``DataParallelBucketed``, 25 MiB buckets),
  overlapped with the rest of backward only where a spare core can carry it;
- **pp**: 1F1B played through (``labkit.plan_pipeline``) with each stage's own times, one
  point-to-point message of N·h elements per hop — priced as measured while every rank
  computes when the world has more ranks than cores (the sender computes on, the other
  stages take the rest) or the other stages' ranks take every core, else as between pairs —
  and the cores shared by the stages that compute or receive at the same moment: the bubble
  comes out of it;
- **clip**: one all-reduce of a scalar over every rank (``compose.clip_grad_norm_``);
- **optimizer**: Adam per local tensor and element (ZeRO and FSDP2 update 1/dp of them);
- **overhead**: the rest of a step's Python, calibrated on one process;
- **framework**: the strategy's own code beyond all that — ZeRO's packing per unit, FSDP2's
  hooks and copies, DTensor's dispatch — timed on one process with every collective removed
  (``Workload.framework``; for a strategy not timed, its flavour's cost per unit collective
  times its unit collectives; else nothing); shared like compute.

Every collective is ``labkit.costmodel.predict_collective`` on its group's size, with the
fixed cost a call pays between bursts of compute (``sync_s`` and ``wake_s``, calibrated so);
a group smaller than the world runs while the other groups' ranks also want the cores: its
call is priced as measured with every group calling at once where the calibration measured
groups of its size inside this world (``wake_s``), else scaled by the compute sharing of the
world over that of the group. With more ranks than cores, a group's call inside forward or
backward (tp's all-reduces, ZeRO-3's gathers) costs instead the CPU time it was measured to
take (``cpu_s``) times the ranks taking turns on a core (``MachineModel.turns``): nothing keeps
the groups in step there, and while one pair waits in its call the other computes on the core
it left — the step is as long as the cores' work. The calls after backward (dp, clip) find
every group arriving at once, as measured.

Pure arithmetic, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from labkit.costmodel.machine import NETWORK_KIND, P2P_BUSY, MachineModel, predict_collective
from labkit.parallel.dims import ParallelDims
from labkit.plan_pipeline import pipeline_time
from labkit.plan_workload import Workload, framework_key

__all__ = ["StepTime", "collective_counts", "framework_time", "step_time"]


@dataclass(frozen=True)
class StepTime:
    """``step_time``'s result: the parts of one step (seconds) and a line explaining each.

    Attributes:
        compute_s: forward and backward of the busiest rank (per-micro-batch collectives of
            tp and ZeRO-3 included where they block the compute).
        bubble_s: the pipeline's idle time on the stage that finishes last (hops included).
        comm: seconds by kind: ``"dp"`` (after backward), ``"tp"``, ``"zero3"`` (the
            per-micro-batch gathers), ``"clip"``; tp and zero3 are part of ``compute_s``'s
            path and listed here for the reader (not added twice).
        optimizer_s: Adam on this rank's parameters.
        overhead_s: the step's other Python.
        reasons: one line per term.
        framework_s: the strategy's own code beyond layers, Adam and overhead (calibrated).
    """

    compute_s: float
    bubble_s: float
    comm: dict[str, float]
    optimizer_s: float
    overhead_s: float
    reasons: list[str] = field(default_factory=list)
    framework_s: float = 0.0

    @property
    def step_s(self) -> float:
        """The whole step."""
        exposed = self.comm.get("dp", 0.0) + self.comm.get("clip", 0.0)
        own = self.optimizer_s + self.overhead_s + self.framework_s
        return self.compute_s + self.bubble_s + exposed + own


class _Pricer:
    """Collectives of one run: ``predict_collective`` on a group, scaled for the whole world."""

    def __init__(self, machine: MachineModel, backend: str, world: int) -> None:
        self.machine, self.backend, self.world = machine, backend, world

    def __call__(self, op: str, n_bytes: float, group: int, inside: bool = False) -> float:
        m = self.machine
        if op in ("p2p", P2P_BUSY):  # a hop: measured while the whole world passes messages
            return predict_collective(m, self.backend, op, n_bytes, self.world, True)
        if group <= 1:
            return 0.0
        if inside and group < self.world and self.world > m.cores:
            # inside forward or backward, out of step with the other groups, on too few cores:
            # the step pays what the call takes from the cores, the others compute through
            # its waits
            cpu = m.backend(self.backend).cpu(op, group, self.world, n_bytes)
            if cpu is not None:
                return cpu * m.turns(self.world)
        if group < self.world and (op, group, self.world) in m.backend(self.backend).wake_s:
            # measured so: every group calling at once while the others compute
            return predict_collective(m, self.backend, op, n_bytes, group, True, self.world)
        t = predict_collective(m, self.backend, op, n_bytes, group, between_compute=True)
        return t * m.compute_share_at(self.world) / m.compute_share_at(group)


def _padded(unit: tuple[int, ...], dp: int, frac: float = 1.0) -> int:
    """Elements of a unit's all-gather output: dp × the sum of ⌈numel/dp⌉ per parameter."""
    return dp * sum(max(1, math.ceil(n * frac / dp)) for n in unit)


def _overlap(machine: MachineModel, backend: str, world: int) -> bool:
    """Communication overlaps compute only where it does not need the ranks' cores."""
    return machine.backend(backend).kind == NETWORK_KIND or machine.cores > world


def step_time(
    workload: Workload,
    machine: MachineModel,
    backend: str,
    dims: ParallelDims,
    zero_stage: int = 0,
    fsdp: bool = False,
    microbatches: int = 1,
) -> StepTime:
    """Predicted time of one optimizer step of ``workload`` under a strategy.

    The terms are this module's docstring.

    Args:
        workload: the model's layers and the step (``Workload``).
        machine: the calibrated ``MachineModel`` (or ``MachineModel.from_network``).
        backend: the backend the ranks use (a name in ``machine.backends``).
        dims: the degrees dp, pp, tp.
        zero_stage: 0, or ZeRO stage 1-3 over dp (3 with ``fsdp``: FSDP2).
        fsdp: ZeRO-3 done by FSDP2 (the same collectives per unit).
        microbatches: m: a pipeline's micro-batches, or accumulation steps when pp = 1.

    Returns:
        A ``StepTime``.

    Raises:
        ValueError: a batch that dp·m does not divide, or pp that does not divide the blocks.
    """
    w, dp, pp, tp, m = workload, dims.dp, dims.pp, dims.tp, microbatches
    if w.batch % (dp * m):
        raise ValueError(f"batch {w.batch} is not divisible by dp·m = {dp}·{m}")
    price = _Pricer(machine, backend, dims.world_size)
    share = machine.compute_share_at(dims.world_size)
    zero = zero_stage if dp > 1 else 0
    eb, tokens = w.element_bytes, w.batch // (dp * m) * w.seq_len
    stages = w.stages(pp)
    fwd, bwd, tp_s, gathers = [], [], 0.0, 0.0
    # a pipeline shares the cores only while its stages compute at once (plan_pipeline)
    scale = 1.0 if pp > 1 else share
    for layers in stages:
        f = sum(w.layers[i].time_s(tokens, tp)[0] for i in layers) * scale
        b = sum(w.layers[i].time_s(tokens, tp)[1] for i in layers) * scale
        act = tokens * max(w.layers[layers[0]].width, 1) * eb
        call = price("all_reduce", act, tp, inside=True)
        tf = sum(w.layers[i].tp_rowwise for i in layers) * call
        tb = sum(w.layers[i].tp_colwise for i in layers) * call
        g = 0.0
        if zero == 3:  # every unit gathered before its forward and before its backward
            frac = w.local_numel(layers, tp) / max(1, w.local_numel(layers))
            g = sum(
                price("all_gather", _padded(u, dp, frac) * eb, dp, inside=True)
                for u in w.units(layers)
            )
        fwd.append(f + (tf + g) * scale / share)  # calls priced as they are, not shared again
        bwd.append(b + (tb + g) * scale / share)
        tp_s, gathers = max(tp_s, m * (tf + tb)), max(gathers, 2 * m * g)
    reasons = [f"micro-batch: b = B/(dp·m) = {w.batch}/({dp}·{m}), {tokens} tokens"]
    if pp > 1:
        msg = tokens * w.layers[stages[0][-1]].width * eb
        hop, busy_hop = price("p2p", msg, 2), price(P2P_BUSY, msg, 2)

        def hop_s(computing: int) -> float:  # every core taken: the receiver waits for one
            return busy_hop if computing >= machine.cores else hop

        # more ranks than cores: the sender computes on, the others hold the rest of the cores
        hops = busy_hop if dims.world_size > machine.cores else hop_s
        pipe = pipeline_time(
            fwd, bwd, m, hops, machine.compute_share_at, copies=dp * tp, receiving_computes=True
        )
        compute = max(pipe.busy_s) * share  # the busiest stage's work, as shared as it gets
        compute = min(compute, pipe.step_s)
        bubble = pipe.step_s - compute
        reasons.append(
            f"1F1B over {pp} stages, {m} micro-batches: busiest stage {compute * 1e3:.3g} ms, "
            f"bubble {bubble * 1e3:.3g} ms (hops of {hop * 1e6:.0f} us, "
            f"{busy_hop * 1e6:.0f} us while every core computes)"
        )
    else:
        compute, bubble = m * (fwd[0] + bwd[0]), 0.0
        reasons.append(f"{m} × (forward + backward) = {compute * 1e3:.3g} ms")
    dp_s = _dp_comm(w, machine, backend, price, stages, zero, dims, max(bwd))
    clip = price("all_reduce", 4, dims.world_size)
    opt, overhead = _optimizer(w, stages, zero, dp, tp) * share, w.step_overhead_s * share
    own = framework_time(w, dims, zero_stage, fsdp, m) * share
    comm = {"dp": dp_s, "tp": tp_s, "zero3": gathers, "clip": clip}
    reasons += [
        f"tp: {tp_s * 1e3:.3g} ms of all-reduces inside forward and backward" if tp > 1 else "",
        f"ZeRO-3 gathers {gathers * 1e3:.3g} ms inside forward and backward" if zero == 3 else "",
        f"dp: {dp_s * 1e3:.3g} ms after backward; clip all-reduce {clip * 1e3:.3g} ms",
        f"Adam {opt * 1e3:.3g} ms; other Python {overhead * 1e3:.3g} ms "
        f"(compute sharing ×{share:.2f} for {dims.world_size} ranks on {machine.cores} cores)",
        f"the strategy's own code {own * 1e3:.3g} ms" if own else "",
    ]
    return StepTime(compute, bubble, comm, opt, overhead, [r for r in reasons if r], own)


def framework_time(
    workload: Workload, dims: ParallelDims, zero_stage: int = 0, fsdp: bool = False,
    microbatches: int = 1,
) -> float:  # fmt: skip
    """Seconds of the strategy's own code per step on one process (``Workload.framework``),
    else its flavour's cost per unit collective times its unit collectives, else 0."""
    w, m = workload, microbatches
    key = framework_key(dims.dp, dims.pp, dims.tp, zero_stage, fsdp, m)
    if key in w.framework:
        return w.framework[key]
    zero = key[3]
    rate = w.unit_call_s.get("fsdp" if fsdp else f"zero{zero}") if zero else None
    if not rate:
        return 0.0
    counts = collective_counts(w, dims, zero, m)
    return rate * (counts["all_gather"] + counts["reduce_scatter"])


def _dp_comm(w, machine, backend, price, stages, zero, dims, last_bwd) -> float:
    """Seconds of dp communication after (or, where it can overlap, beside) the last
    micro-batch's backward (``last_bwd``)."""
    dp, tp = dims.dp, dims.tp
    if dp <= 1:
        return 0.0
    eb, worst = w.element_bytes, 0.0
    for layers in stages:
        if zero == 0:
            sizes = w.buckets(layers, tp)
            total = sum(price("all_reduce", n, dp) for n in sizes)
            if _overlap(machine, backend, dims.world_size) and len(sizes) > 1:  # hidden
                total = max(total - last_bwd, price("all_reduce", sizes[-1], dp))
        else:
            frac = w.local_numel(layers, tp) / max(1, w.local_numel(layers))
            units = [_padded(u, dp, frac) * eb for u in w.units(layers)]
            total = sum(price("reduce_scatter", n, dp) for n in units)
            if zero in (1, 2):  # the updated shards gathered after Adam
                total += sum(price("all_gather", n, dp) for n in units)
        worst = max(worst, total)
    return worst


def _optimizer(w: Workload, stages: list[list[int]], zero: int, dp: int, tp: int) -> float:
    per_tensor, per_element = w.adam
    worst = 0.0
    for layers in stages:
        elements = w.local_numel(layers, tp) / (dp if zero else 1)
        worst = max(worst, per_tensor * w.tensors(layers) + per_element * elements)
    return worst


def collective_counts(
    workload: Workload, dims: ParallelDims, zero_stage: int = 0, microbatches: int = 1
) -> dict[str, int]:
    """The calls one rank of the busiest stage makes in one step, as ``step_time`` prices them.

    What labkit's implementations issue (this module's docstring), so a recording backend can
    check the model (notebook 21 counts FSDP2's; tests/test_plan_counts.py every strategy):
    ``"all_reduce"`` (tp's per layer, DDP's per bucket, the clipping's one), ``"all_gather"``
    and ``"reduce_scatter"`` (ZeRO and FSDP2, per unit), ``"send"`` and ``"recv"``
    (activations forward and gradients backward between stages).

    Args:
        workload: the model.
        dims: the degrees.
        zero_stage: 0, or 1-3 (3 also for FSDP2) over dp.
        microbatches: m (a pipeline's, or accumulation steps when pp = 1).

    Returns:
        Per op, calls per step on the first stage's ranks (the last stage's for p2p, which
        receives as much as the first sends).
    """
    dp, pp, tp, m = dims.dp, dims.pp, dims.tp, microbatches
    zero = zero_stage if dp > 1 else 0
    layers = workload.stages(pp)[0]
    units = len(workload.units(layers))
    tp_calls = m * sum(
        workload.layers[i].tp_colwise + workload.layers[i].tp_rowwise for i in layers
    )
    counts = {
        "all_reduce": (tp_calls if tp > 1 else 0) + (dims.world_size > 1),
        "all_gather": 0,
        "reduce_scatter": 0,
        "send": m if pp > 1 else 0,
        "recv": m if pp > 1 else 0,
    }
    if dp > 1 and zero == 0:
        counts["all_reduce"] += len(workload.buckets(layers, tp))
    elif zero:
        counts["reduce_scatter"] = units
        counts["all_gather"] = units if zero in (1, 2) else 2 * m * units
    return counts
