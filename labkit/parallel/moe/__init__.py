"""Mixture of experts and expert parallelism: router, dispatch and combine, a layer, EP × DP.

Introduced in notebooks/17_expert_parallel.ipynb.

    from labkit.parallel import moe
    layer = moe.MoELayer(d_model=8, n_experts=4, d_ff=16, top_k=2, capacity_factor=1.0)
    y = layer(x, n_groups=2)            # one process; layer.aux_loss, layer.routing
    ep_layer = moe.ExpertParallelMoE(layer, group)   # in each rank: its experts, tokens moved
    y_local = ep_layer(x_local)         # equals y's rows of this rank

Modules: ``router`` (softmax gate, top-k, capacity and drops, the load-balancing loss),
``layer`` (the single-process reference), ``dispatch`` (all-to-all with uneven splits, from
send/recv, with ``dist.all_to_all_single`` and with PyTorch's differentiable one), ``ep``
(``ExpertParallelMoE``, ``apply_ep``, the EP × DP gradient reduction). Capacity and bytes are
arithmetic in ``labkit.costmodel.moe``; the rank grid in ``ParallelDims.expert_groups``.
"""

from __future__ import annotations

from labkit.parallel.moe.dispatch import IMPLS, all_to_all, all_to_all_p2p, exchange_counts
from labkit.parallel.moe.ep import (
    ExpertParallelMoE,
    apply_ep,
    expert_parameters,
    reduce_ep_gradients,
)
from labkit.parallel.moe.layer import MoELayer, combine, run_experts
from labkit.parallel.moe.router import (
    Routing,
    TopKRouter,
    dispatch_order,
    load_balancing_loss,
    route,
)

__all__ = [
    "IMPLS",
    "ExpertParallelMoE",
    "MoELayer",
    "Routing",
    "TopKRouter",
    "all_to_all",
    "all_to_all_p2p",
    "apply_ep",
    "combine",
    "dispatch_order",
    "exchange_counts",
    "expert_parameters",
    "load_balancing_loss",
    "reduce_ep_gradients",
    "route",
    "run_experts",
]
