"""Figures for the course: every function returns a matplotlib Figure (tests call them headless).

Importing ``labkit.viz`` loads matplotlib; ``import labkit`` alone does not.
Each submodule serves the notebooks named in its docstring; re-export public functions here.
"""

from __future__ import annotations

from labkit.viz._display import enable_inline_figures
from labkit.viz.activations import activation_terms
from labkit.viz.algorithms import allreduce_times, message_diagram, traffic_per_rank
from labkit.viz.async_sgd import sgd_loss_curves, staleness_histogram
from labkit.viz.collectives import collective_diagram, value_origins
from labkit.viz.context import causal_work
from labkit.viz.cost import (
    algbw_busbw,
    algorithm_crossover,
    predicted_vs_measured,
    what_if_scaling,
)
from labkit.viz.cost_sweep import predicted_time_sweep
from labkit.viz.ddp import bucket_size_sweep, comm_hook_tradeoff
from labkit.viz.fault_tolerance import resume_timeline
from labkit.viz.memory import zero_memory_breakdown
from labkit.viz.mesh import plan_breakdown
from labkit.viz.model_split import stage_memory
from labkit.viz.moe import expert_load
from labkit.viz.p2p import p2p_latency_bandwidth
from labkit.viz.perf import speedup_bars
from labkit.viz.pipeline import schedule_grid, schedule_vs_timeline
from labkit.viz.recompute import recompute_tradeoff
from labkit.viz.ring import ring_allreduce_step
from labkit.viz.timeline import timeline
from labkit.viz.training import loss_curves, lr_schedule

__all__: list[str] = [
    "activation_terms",
    "algbw_busbw",
    "algorithm_crossover",
    "allreduce_times",
    "bucket_size_sweep",
    "causal_work",
    "collective_diagram",
    "comm_hook_tradeoff",
    "expert_load",
    "loss_curves",
    "lr_schedule",
    "message_diagram",
    "p2p_latency_bandwidth",
    "plan_breakdown",
    "predicted_time_sweep",
    "predicted_vs_measured",
    "recompute_tradeoff",
    "resume_timeline",
    "ring_allreduce_step",
    "schedule_grid",
    "schedule_vs_timeline",
    "sgd_loss_curves",
    "stage_memory",
    "speedup_bars",
    "staleness_histogram",
    "timeline",
    "traffic_per_rank",
    "value_origins",
    "what_if_scaling",
    "zero_memory_breakdown",
]

enable_inline_figures()  # show returned Figures in Jupyter without pyplot
