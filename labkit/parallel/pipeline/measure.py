"""The bubble of each schedule measured on real ranks, next to its theory.

Introduced in notebooks/11_pipeline_parallel.ipynb.

On CPU ranks a tiny stage computes in microseconds, far less than a message takes, so a raw
timing measures communication, not the schedule. As notebook 11 does, every action is made
to take a fixed time (a sleep inside its span, ``run_schedule(compute_s=...)``), here in the
zero-bubble paper's cost model (Qi et al. 2023, §3): a forward ``F``, an input-backward ``B``
and a weight-backward ``W`` take ``c`` each, so a whole backward (GPipe, 1F1B, interleaved)
takes ``2c``, and a chunk of an interleaved stage ``1/v`` of those. Every schedule then does
the same work, ``3mc`` per rank, and the theories are:

    GPipe, 1F1B   (p − 1)/(m + p − 1)       Huang et al. 2019, §2.3
    interleaved   (p − 1)/(v·m + p − 1)     Narayanan et al. 2021, §2.2
    ZB-H1         (p − 1)/(3m + p − 1)      Qi et al. 2023, §3.1 (m ≥ p)

The measured bubble is ``measured_bubble_fraction`` of the ranks' action spans. Each slot also
carries a message hop, so measured ≥ theory by the hop's share (notebook 11's tolerance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labkit.launcher import get_device, launch
from labkit.models import MLP
from labkit.parallel.pipeline.metrics import (
    bubble_fraction_theory,
    measured_bubble_fraction,
    zb_h1_bubble_fraction,
)
from labkit.parallel.pipeline.runtime import run_schedule, stages_of_rank
from labkit.parallel.pipeline.schedules import (
    Schedule,
    gpipe,
    interleaved_one_f_one_b,
    one_f_one_b,
)
from labkit.parallel.pipeline.split import output_shapes, split_sequential
from labkit.parallel.pipeline.zero_bubble import zb_h1
from labkit.trace import Timeline, events, reset

__all__ = ["KINDS", "BubbleRow", "compute_times", "measure_bubbles", "schedule_named"]

KINDS = ("gpipe", "1f1b", "interleaved", "zb_h1")


def schedule_named(kind: str, n_ranks: int, n_microbatches: int, n_virtual: int = 1) -> Schedule:
    """The schedule called ``kind``: ``"gpipe"``, ``"1f1b"``, ``"interleaved"`` or ``"zb_h1"``.

    Args:
        kind: one of ``KINDS``.
        n_ranks: pipeline ranks ``p``.
        n_microbatches: micro-batches ``m``.
        n_virtual: virtual stages per rank (``"interleaved"`` only).

    Returns:
        Schedule: the generated schedule.

    Raises:
        ValueError: an unknown kind (or the generator's own errors).
    """
    if kind == "interleaved":
        return interleaved_one_f_one_b(n_ranks, n_microbatches, n_virtual)
    makers = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb_h1": zb_h1}
    if kind not in makers:
        raise ValueError(f"unknown schedule {kind!r}; known: {KINDS}")
    return makers[kind](n_ranks, n_microbatches)


def compute_times(kind: str, compute_s: float, n_virtual: int = 1) -> dict[str, float]:
    """Seconds each op sleeps: F = B = W = ``c``, a whole backward ``2c``, a chunk ``1/v``.

    Args:
        kind: one of ``KINDS``.
        compute_s: ``c``, the time of one forward of a whole stage.
        n_virtual: virtual stages per rank ``v``.

    Returns:
        dict: op → seconds, for ``run_schedule(compute_s=...)``.
    """
    c = compute_s / n_virtual
    return {"F": c, "B": c, "W": c} if kind == "zb_h1" else {"F": c, "B": 2 * c}


def _theory(kind: str, p: int, m: int, v: int) -> float:
    if kind == "zb_h1":
        return zb_h1_bubble_fraction(p, m)
    return bubble_fraction_theory(p, m, v if kind == "interleaved" else 1)


@dataclass(frozen=True)
class BubbleRow:
    """One schedule's bubble: theory and measurement, and the step's length.

    Attributes:
        kind: the schedule's name.
        n_ranks, n_microbatches, n_virtual: ``p``, ``m``, ``v``.
        theory: the closed-form bubble fraction.
        measured: the measured one (``measured_bubble_fraction``).
        step_ms: the measured step, first action to last, on any rank.
        ideal_ms: the step the theory predicts: ``3mc / (1 − theory)``.
        timeline: the timed step's ``lk.trace.Timeline`` (for ``lk.viz.schedule_vs_timeline``);
            not part of the row's equality or repr.
    """

    kind: str
    n_ranks: int
    n_microbatches: int
    n_virtual: int
    theory: float
    measured: float
    step_ms: float
    ideal_ms: float
    timeline: Any = field(default=None, compare=False, repr=False)

    @property
    def ratio(self) -> float:
        """measured / theory (inf when the theory is 0)."""
        return self.measured / self.theory if self.theory else float("inf")


def _timed_steps(rank: int, world_size: int, cases, compute_s: float, seed: int) -> list:
    dev = get_device()
    out = []
    for kind, m, v in cases:
        n_stages = world_size * v
        model = MLP(in_features=8, hidden=(8,) * n_stages, out_features=4, seed=seed).to(dev)
        parts = split_sequential(model.net, n_stages)
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(2 * m, 8, generator=g), torch.randint(0, 4, (2 * m,), generator=g)
        xs, ys = list(x.to(dev).chunk(m)), list(y.to(dev).chunk(m))
        schedule = schedule_named(kind, world_size, m, v)
        mine = {s: parts[s] for s in stages_of_rank(rank, world_size, n_stages)}
        shapes = output_shapes(parts, xs[0])
        run_schedule(schedule, mine, xs, ys, F.cross_entropy, shapes)  # warm-up
        dist.barrier()
        reset()
        times = compute_times(kind, compute_s, v)
        run_schedule(schedule, mine, xs, ys, F.cross_entropy, shapes, compute_s=times)
        out.append(events())
        dist.barrier()
    return out


def measure_bubbles(
    world_size: int = 4,
    n_microbatches: int = 8,
    compute_ms: float = 20.0,
    kinds: Sequence[str] = KINDS,
    n_virtual: int = 2,
    backend: str = "auto",
    device: str = "auto",
    seed: int = 0,
    timeout: float = 300.0,
) -> list[BubbleRow]:
    """Run each schedule once on ``world_size`` ranks with emulated compute; measure its bubble.

    One launch runs every schedule (a warm-up step, then the timed one) on a small MLP cut
    into ``world_size`` stages (``world_size · n_virtual`` for interleaved).

    Args:
        world_size: pipeline ranks ``p``.
        n_microbatches: micro-batches ``m`` (a multiple of ``p`` for interleaved).
        compute_ms: ``c``: a whole stage's forward, and each of B and W (module docstring).
        kinds: which schedules, from ``KINDS``.
        n_virtual: ``v`` for the interleaved schedule.
        backend, device: as ``lk.launch``.
        seed: model and data seed.
        timeout: seconds for the launch.

    Returns:
        list[BubbleRow]: one row per kind, in order.

    Raises:
        ValueError: an unknown kind, or ``n_microbatches`` not a multiple of ``world_size``
            with ``"interleaved"``.
    """
    p, m = world_size, n_microbatches
    cases = [(k, m, n_virtual if k == "interleaved" else 1) for k in kinds]
    for k, _, v in cases:
        schedule_named(k, p, m, v)  # fail here, before any process starts
    per_rank = launch(
        _timed_steps,
        world_size=p,
        backend=backend,
        device=device,
        args=(cases, compute_ms / 1e3, seed),
        timeout=timeout,
    )
    rows = []
    for j, (kind, _, v) in enumerate(cases):
        timeline = Timeline.merge([r[j] for r in per_rank])
        spans = [s for s in timeline.spans if "op" in s.args]
        step_ms = (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) / 1e6
        theory = _theory(kind, p, m, v)
        measured = measured_bubble_fraction(timeline)
        ideal_ms = 3 * m * compute_ms / (1 - theory)
        rows.append(BubbleRow(kind, p, m, v, theory, measured, step_ms, ideal_ms, timeline))
    return rows
