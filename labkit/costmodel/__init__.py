"""The α-β-γ cost model of collective communication: pure arithmetic, instant, no processes.

Introduced in notebooks/05_communication_cost.ipynb.

A message of n bytes costs α + n·β (Hockney 1994); a collective is a schedule of messages,
so its cost is ``steps·α + bytes·n·β + reduce·n·γ`` with coefficients per algorithm from
Thakur, Rabenseifner and Gropp, "Optimization of Collective Communication Operations in
MPICH", IJHPCA 19(1), 2005. nccl-tests' algbw/busbw turn measured times into bandwidths.

    net = lk.Network.preset("10GbE")                     # or lk.costmodel.fit(sizes, times)
    lk.costmodel.predict("all_reduce", 64 << 20, 1024, net, algorithm="ring")   # seconds
    lk.costmodel.crossover_bytes("all_reduce", 8, net, "recursive_doubling", "ring")
    lk.costmodel.busbw_factor("all_reduce", 8)           # 2(p−1)/p = 1.75

Modules: ``network`` (``Network``, presets, ``fit``), ``terms`` (``CostTerms``), ``formulas``
(``cost_terms`` per collective and algorithm), ``pipelined`` (the pipelined tree all-reduce,
whose cost depends on its segment count), ``bandwidth`` (busbw factors), ``predict``
(predictions, crossover, what-if), ``ddp`` (a bucketed backward on one link, PowerSGD's
sizes), ``fsdp`` (an FSDP step on one link, with and without asynchronous prefetch),
``sequence_parallel`` and ``ring_attention`` (collectives and messages per step of
notebooks 15 and 16), ``moe`` (expert capacity and the all-to-all bytes of expert
parallelism); and the model calibrated on a machine: ``recipes`` (what each backend's
implementation does per call), ``machine`` (``MachineModel``, ``predict_collective``),
``calibrate`` (from microbenchmark samples to a ``MachineModel``; ``lk.bench.calibrate``
measures them). Nothing here imports torch.
"""

from __future__ import annotations

from labkit.costmodel.bandwidth import algbw, busbw, busbw_factor
from labkit.costmodel.ddp import bucketed_backward_s, powersgd_numel
from labkit.costmodel.formulas import (
    ALGORITHMS,
    COLLECTIVES,
    DEFAULT_ALGORITHM,
    LABELS,
    SEGMENTED,
    CostTerms,
    cost_terms,
)
from labkit.costmodel.fsdp import FsdpStepTime, fsdp_step_s
from labkit.costmodel.machine import (
    BackendCosts,
    MachineModel,
    collective_terms,
    predict_collective,
)
from labkit.costmodel.moe import expert_capacity, moe_all_to_all_bytes, uniform_tokens_sent
from labkit.costmodel.network import PRESETS, Network, fit
from labkit.costmodel.pipelined import best_segments, pipelined_tree_terms
from labkit.costmodel.predict import (
    best_algorithm,
    crossover_bytes,
    predict,
    predict_all,
    what_if,
)
from labkit.costmodel.ring_attention import RingTraffic, ring_attention_traffic
from labkit.costmodel.sequence_parallel import (
    sequence_parallel_collectives,
    tensor_parallel_collectives,
)

__all__ = [
    "ALGORITHMS",
    "BackendCosts",
    "COLLECTIVES",
    "DEFAULT_ALGORITHM",
    "LABELS",
    "MachineModel",
    "PRESETS",
    "RingTraffic",
    "SEGMENTED",
    "CostTerms",
    "FsdpStepTime",
    "Network",
    "algbw",
    "best_algorithm",
    "best_segments",
    "bucketed_backward_s",
    "busbw",
    "busbw_factor",
    "collective_terms",
    "cost_terms",
    "crossover_bytes",
    "expert_capacity",
    "fit",
    "fsdp_step_s",
    "moe_all_to_all_bytes",
    "pipelined_tree_terms",
    "powersgd_numel",
    "predict",
    "predict_all",
    "predict_collective",
    "ring_attention_traffic",
    "sequence_parallel_collectives",
    "tensor_parallel_collectives",
    "uniform_tokens_sent",
    "what_if",
]
