"""Memory model of training: parameters, gradients, optimizer states per device, ZeRO stages.

Introduced in notebooks/13_zero_and_fsdp.ipynb.

Mixed-precision Adam keeps, per parameter, 2 bytes of fp16 weights, 2 bytes of fp16 gradients
and K = 12 bytes of optimizer state (fp32 master weights, momentum and variance): 16Ψ bytes
for Ψ parameters on every data-parallel replica. ZeRO-DP partitions these model states over
the N_d data-parallel ranks (Rajbhandari, Rasley, Ruwase and He, "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models", SC 2020, §5 and Figure 1):

- stage 0, baseline data parallelism: (2 + 2 + K)Ψ;
- stage 1, P_os (optimizer states partitioned): 2Ψ + 2Ψ + KΨ/N_d;
- stage 2, P_os+g (and gradients): 2Ψ + (2 + K)Ψ/N_d;
- stage 3, P_os+g+p (and parameters): (2 + 2 + K)Ψ/N_d.

The paper counts GB as 10⁹ bytes (7.5B parameters · 16 bytes = 120 GB). Pure arithmetic: no
processes, no torch.distributed. ``zero_rank_bytes`` sizes the same states for a real
``nn.Module`` sharded as one padded flat buffer; ``activation_bytes_per_layer`` is the
activation model of a transformer layer (Korthikanti et al. 2022), ``block_activation_terms``
the same tensor by tensor, with its assumptions as arguments (notebook 15), both under
none / selective / full recomputation with ``block_flops`` the products recomputation adds
(notebook 14), ``attention_saved_bytes`` plain attention's s×s against ring attention's blocks
(notebook 16).

    lk.memory.zero_memory(7.5e9, dp_degree=64, stage=1).total_gb   # 31.40625 (paper: 31.4)
    lk.memory.table()                                              # rows for 1.5B–1T × DP
"""

from __future__ import annotations

from labkit.memory.activations import activation_bytes_per_layer
from labkit.memory.attention import attention_saved_bytes, score_block_bytes
from labkit.memory.block_activations import (
    ATTENTION_CORE_TERMS,
    ATTENTION_KINDS,
    RECOMPUTE_MODES,
    block_activation_bytes,
    block_activation_terms,
)
from labkit.memory.recompute import block_flops
from labkit.memory.sharded import zero_rank_bytes
from labkit.memory.zero import (
    ADAM_MIXED_K,
    DP_DEGREES,
    GB,
    MODEL_SIZES,
    STAGE_NAMES,
    STAGES,
    MemoryBreakdown,
    per_device_bytes,
    table,
    zero_memory,
)

__all__ = [
    "ADAM_MIXED_K",
    "ATTENTION_CORE_TERMS",
    "ATTENTION_KINDS",
    "DP_DEGREES",
    "GB",
    "MODEL_SIZES",
    "RECOMPUTE_MODES",
    "STAGES",
    "STAGE_NAMES",
    "MemoryBreakdown",
    "activation_bytes_per_layer",
    "attention_saved_bytes",
    "block_activation_bytes",
    "block_activation_terms",
    "block_flops",
    "per_device_bytes",
    "score_block_bytes",
    "table",
    "zero_memory",
    "zero_rank_bytes",
]
