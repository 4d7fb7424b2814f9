"""Small models for the labs: an MLP and a CNN for the 8×8 digits, a size-dialled MLP, TinyGPT.

One file per concept: ``small`` (MLP, CNN, ComputeDelay), ``transformer`` (attention,
MLP, block), ``gpt`` (TinyGPT).

Introduced in notebooks/06_data_parallel.ipynb. Models live here, never inside
``labkit/parallel/`` (a parallelism wraps any model; STYLE.md "model-agnostic vs model-specific").

Every constructor takes a ``seed`` and builds the same parameters on every process for the same
seed, so single-process references and ranks start from identical weights without a broadcast.
"""

from __future__ import annotations

from labkit.models.gpt import TinyGPT, gpt_parameter_count
from labkit.models.small import CNN, MLP, ComputeDelay, count_parameters, mlp_with_parameters
from labkit.models.transformer import FeedForward, SelfAttention, TransformerBlock

__all__ = [
    "CNN",
    "MLP",
    "ComputeDelay",
    "FeedForward",
    "SelfAttention",
    "TinyGPT",
    "TransformerBlock",
    "count_parameters",
    "gpt_parameter_count",
    "mlp_with_parameters",
]
