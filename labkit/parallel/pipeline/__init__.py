"""Pipeline parallelism: schedules as data, a validator, a runtime over send/recv, metrics.

Introduced in notebooks/11_pipeline_parallel.ipynb.

    from labkit.parallel.pipeline import gpipe, validate, format_schedule
    s = gpipe(n_stages=4, n_microbatches=8)   # list per rank of Action | None
    validate(s, n_stages=4, n_microbatches=8)  # raises ScheduleError if a rule is broken
    print(format_schedule(s))

Zero-bubble pipelines (Qi et al. 2023) split each backward into ``B`` (input gradient) and
``W`` (weight gradients): ``zb_h1`` is their ZB-H1 schedule, ``split_backward`` how the
runtime computes B and W with autograd, ``measure_bubbles`` the bubble of each schedule
measured next to its theory.

The runtime (``run_schedule``, ``split_sequential``, ``split_backward``, ``measure_bubbles``)
imports torch and loads on first use, so the schedule part stays importable without it.
"""

from __future__ import annotations

import importlib

from labkit.parallel.pipeline.metrics import (
    bubble_fraction,
    bubble_fraction_theory,
    measured_bubble_fraction,
    peak_in_flight,
    peak_in_flight_theory,
    zb_h1_bubble_fraction,
    zb_h1_slots,
)
from labkit.parallel.pipeline.schedules import (
    Action,
    Schedule,
    format_schedule,
    gpipe,
    interleaved_one_f_one_b,
    one_f_one_b,
    place,
    rank_of_stage,
    splits_backward,
)
from labkit.parallel.pipeline.validate import ScheduleError, validate
from labkit.parallel.pipeline.zero_bubble import actions_from_torch, zb_h1, zb_h1_orders

# name -> module under labkit.parallel.pipeline, imported on first use (they import torch)
_LAZY = {
    "PipelineResult": "runtime",
    "output_shapes": "runtime",
    "run_schedule": "runtime",
    "split_sequential": "runtime",
    "stages_of_rank": "runtime",
    "messages_in_order": "wire",
    "PendingWeights": "split_backward",
    "backward_input": "split_backward",
    "backward_weight": "split_backward",
    "BubbleRow": "measure",
    "measure_bubbles": "measure",
    "schedule_named": "measure",
}

__all__ = [
    "Action",
    "BubbleRow",
    "PendingWeights",
    "PipelineResult",
    "Schedule",
    "ScheduleError",
    "actions_from_torch",
    "backward_input",
    "backward_weight",
    "bubble_fraction",
    "bubble_fraction_theory",
    "format_schedule",
    "gpipe",
    "interleaved_one_f_one_b",
    "measure_bubbles",
    "measured_bubble_fraction",
    "messages_in_order",
    "one_f_one_b",
    "output_shapes",
    "peak_in_flight",
    "peak_in_flight_theory",
    "place",
    "rank_of_stage",
    "run_schedule",
    "schedule_named",
    "split_sequential",
    "splits_backward",
    "stages_of_rank",
    "validate",
    "zb_h1",
    "zb_h1_bubble_fraction",
    "zb_h1_orders",
    "zb_h1_slots",
]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(f"labkit.parallel.pipeline.{_LAZY[name]}")
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'labkit.parallel.pipeline' has no attribute {name!r}")
