"""ipywidgets explorers bound to labkit's real code: each callback is a plain, testable method.

Introduced in notebooks/03_allreduce_algorithms.ipynb (``ring_stepper``),
notebooks/05_communication_cost.ipynb (``cost_explorer``),
notebooks/11_pipeline_parallel.ipynb (``pipeline_explorer``),
notebooks/13_zero_and_fsdp.ipynb (``zero_memory_explorer``) and
notebooks/18_hybrid_parallel.ipynb (``planner_explorer``).

``lk.widgets.ring_stepper()`` returns an ipywidgets container to show in a cell; the explorer
behind it (``box.explorer``, or the class itself, e.g. ``lk.widgets.RingStepper()``) has the
callback (``show(frame)``, ``update(...)``) that sets ``figure`` and ``text``, so tests drive
it headless. ipywidgets is imported only when a container is built; ``import labkit`` never
imports this package.
"""

from __future__ import annotations

from labkit.widgets.cost import CostExplorer, cost_explorer
from labkit.widgets.memory import ZeroMemoryExplorer, zero_memory_explorer
from labkit.widgets.pipeline import PipelineExplorer, pipeline_explorer
from labkit.widgets.planner import PlannerExplorer, planner_explorer
from labkit.widgets.ring import RingStepper, ring_stepper

__all__ = [
    "CostExplorer",
    "PipelineExplorer",
    "PlannerExplorer",
    "RingStepper",
    "ZeroMemoryExplorer",
    "cost_explorer",
    "pipeline_explorer",
    "planner_explorer",
    "ring_stepper",
    "zero_memory_explorer",
]
