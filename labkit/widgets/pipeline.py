"""Explore pipeline schedules: stages, micro-batches, schedule → the grid and its bubble.

Introduced in notebooks/11_pipeline_parallel.ipynb.

Schedules are ``labkit.parallel.pipeline``'s own generators (GPipe, 1F1B, interleaved 1F1B),
checked by its validator; the bubble is measured on the schedule and compared with the closed
form (Huang et al. 2019, §2.3; Narayanan et al. 2021, §2.2); ``lk.viz.schedule_grid`` draws it.
"""

from __future__ import annotations

from typing import Any

from labkit.parallel.pipeline import (
    Schedule,
    bubble_fraction,
    bubble_fraction_theory,
    gpipe,
    interleaved_one_f_one_b,
    one_f_one_b,
    peak_in_flight,
    validate,
)
from labkit.viz.pipeline import schedule_grid
from labkit.widgets._base import Explorer

__all__ = ["SCHEDULES", "PipelineExplorer", "pipeline_explorer"]

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def _build(name: str, p: int, m: int, v: int) -> tuple[Schedule, int, int]:
    """The schedule, its number of stages and of virtual stages per rank."""
    if name == "gpipe":
        return gpipe(p, m), p, 1
    if name == "1f1b":
        return one_f_one_b(p, m), p, 1
    if name == "interleaved_1f1b":
        return interleaved_one_f_one_b(p, m, v), p * v, v
    raise ValueError(f"unknown schedule {name!r}; known: {', '.join(SCHEDULES)}")


class PipelineExplorer(Explorer):
    """A pipeline schedule as a grid, with its bubble measured and predicted.

    Args:
        n_stages: pipeline ranks p.
        n_microbatches: micro-batches m (a multiple of p for the interleaved schedule).
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved_1f1b"``.
        n_virtual: virtual stages per rank v (interleaved schedule only).

    Raises:
        ValueError: an unknown schedule or counts the generator rejects.
    """

    def __init__(
        self,
        n_stages: int = 4,
        n_microbatches: int = 8,
        schedule: str = "1f1b",
        n_virtual: int = 2,
    ) -> None:
        super().__init__()
        self.update(n_stages, n_microbatches, schedule, n_virtual)

    def update(
        self, n_stages: int, n_microbatches: int, schedule: str, n_virtual: int = 2
    ) -> dict[str, Any]:
        """Generate and validate the schedule, measure its bubble, redraw; the callback.

        Args:
            n_stages: pipeline ranks p.
            n_microbatches: micro-batches m.
            schedule: one of ``SCHEDULES``.
            n_virtual: virtual stages per rank (interleaved only).

        Returns:
            ``{"schedule", "bubble", "bubble_theory", "peak_in_flight", "slots"}``: the
            schedule (per rank, ``Action`` or None per slot), the idle share of its rank-slots,
            (p − 1)/(v·m + p − 1), the most micro-batches alive per stage, and its length.

        Raises:
            ValueError: an unknown schedule, counts the generator rejects (e.g. m not a
                multiple of p for interleaved 1F1B), or a schedule the validator rejects.
        """
        sched, n_total, v = _build(schedule, n_stages, n_microbatches, n_virtual)
        validate(sched, n_total, n_microbatches)
        p, m = n_stages, n_microbatches
        self.n_stages, self.n_microbatches, self.schedule_name = p, m, schedule
        self.n_virtual = n_virtual
        self.state = {
            "schedule": sched,
            "bubble": bubble_fraction(sched),
            "bubble_theory": bubble_fraction_theory(p, m, v),
            "peak_in_flight": peak_in_flight(sched),
            "slots": max(len(row) for row in sched),
        }
        s = self.state
        self.figure = schedule_grid(
            sched, title=f"{schedule}: p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "")
        )
        peaks = ", ".join(f"{k}: {c}" for k, c in s["peak_in_flight"].items())
        self.text = (
            f"{schedule} on {p} ranks, {m} micro-batches: {s['slots']} slots, bubble "
            f"{s['bubble']:.1%} (theory (p−1)/(v·m+p−1) = {s['bubble_theory']:.1%})"
            f"\nmicro-batches in flight at most, per stage: {peaks}"
        )
        self._redraw()
        return self.state

    def _controls(self, widgets: Any) -> list[Any]:
        stages = widgets.IntSlider(value=self.n_stages, min=1, max=8, description="stages")
        micro = widgets.IntSlider(
            value=self.n_microbatches, min=1, max=32, description="micro-batches"
        )
        name = widgets.ToggleButtons(
            options=list(SCHEDULES), value=self.schedule_name, description="schedule"
        )
        virtual = widgets.IntSlider(value=self.n_virtual, min=1, max=4, description="virtual")

        def refresh(_change: Any) -> None:
            try:
                self.update(stages.value, micro.value, name.value, virtual.value)
            except ValueError as exc:  # e.g. m not a multiple of p for interleaving
                self.text, self.figure = f"cannot build this schedule: {exc}", None
                self._redraw()

        for w in (stages, micro, name, virtual):
            w.observe(refresh, names="value")
        return [name, widgets.HBox([stages, micro, virtual])]


def pipeline_explorer(
    n_stages: int = 4, n_microbatches: int = 8, schedule: str = "1f1b", n_virtual: int = 2
) -> Any:
    """An ipywidgets explorer of pipeline schedules: grid, bubble, activations in flight.

    GPipe (Huang et al. 2019, §2.3), 1F1B and interleaved 1F1B (Narayanan et al. 2021, §2).

    Args:
        n_stages: pipeline ranks p.
        n_microbatches: micro-batches m.
        schedule: ``"gpipe"``, ``"1f1b"`` or ``"interleaved_1f1b"``.
        n_virtual: virtual stages per rank (interleaved only).

    Returns:
        The ipywidgets container; its ``explorer`` attribute is the ``PipelineExplorer``.

    Raises:
        ValueError: as ``PipelineExplorer``.
    """
    return PipelineExplorer(n_stages, n_microbatches, schedule, n_virtual).widget()
