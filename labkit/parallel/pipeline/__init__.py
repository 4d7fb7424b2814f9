"""Pipeline parallelism: schedules as data, a validator, a runtime over send/recv, metrics.

Introduced in notebooks/11_pipeline_parallel.ipynb.

    from labkit.parallel.pipeline import gpipe, validate, format_schedule
    s = gpipe(n_stages=4, n_microbatches=8)   # list per rank of Action | None
    validate(s, n_stages=4, n_microbatches=8)  # raises ScheduleError if a rule is broken
    print(format_schedule(s))

The runtime (``run_schedule``, ``split_sequential``) imports torch and loads on first use, so
the schedule part stays importable without it.
"""

from __future__ import annotations

import importlib

from labkit.parallel.pipeline.metrics import (
    bubble_fraction,
    bubble_fraction_theory,
    measured_bubble_fraction,
    peak_in_flight,
    peak_in_flight_theory,
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
)
from labkit.parallel.pipeline.validate import ScheduleError, validate

_RUNTIME = {
    "PipelineResult",
    "messages_in_order",
    "output_shapes",
    "run_schedule",
    "split_sequential",
    "stages_of_rank",
}

__all__ = [
    "Action",
    "PipelineResult",
    "Schedule",
    "ScheduleError",
    "bubble_fraction",
    "bubble_fraction_theory",
    "format_schedule",
    "gpipe",
    "interleaved_one_f_one_b",
    "measured_bubble_fraction",
    "messages_in_order",
    "one_f_one_b",
    "output_shapes",
    "peak_in_flight",
    "peak_in_flight_theory",
    "place",
    "rank_of_stage",
    "run_schedule",
    "split_sequential",
    "stages_of_rank",
    "validate",
]


def __getattr__(name: str):
    if name in _RUNTIME:
        value = getattr(importlib.import_module("labkit.parallel.pipeline.runtime"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'labkit.parallel.pipeline' has no attribute {name!r}")
