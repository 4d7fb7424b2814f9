"""Naive model parallelism: a sequential model cut into stages, one per rank, over send/recv.

Introduced in notebooks/10_model_parallel.ipynb.

Rank ``r`` of the group holds stage ``r`` — layers ``[a_r, a_{r+1})`` of an ``nn.Sequential``
(``split_model``; the even cut is ``labkit.parallel.pipeline.split_sequential``). Forward:
stage 0 runs the batch, every other stage receives its predecessor's output (a buffer of
the shape agreed up front, ``labkit.parallel.pipeline.output_shapes``: send/recv move raw
bytes), runs its layers and sends its output on; the last stage computes the loss. Backward
runs the other way: each stage receives the gradient of its output, calls
``torch.autograd.backward(output, grad)`` and sends its input's gradient back. Per step that
is ``p − 1`` activation messages and ``p − 1`` gradient messages, each ``batch × width``
elements, and at any moment only one rank computes: a rank idles ``(p − 1)/p`` of the step
(GPipe's bubble with one micro-batch, Huang et al. 2019, §2.3), which pipelining
(``labkit.parallel.pipeline``, notebooks/11_pipeline_parallel.ipynb) shrinks.

Every receive and send waits at most ``timeout_s``; a stage whose output or input disagrees
with the agreed shapes raises ``ValueError`` before anything is sent.

    split = ModelSplit(stages[rank], shapes, loss_fn=F.cross_entropy, group=group)
    result = split.step(x if rank == 0 else None, y if rank == p - 1 else None)
"""

from __future__ import annotations

from labkit.parallel.model_split.idle import idle_fraction_theory, idle_fractions
from labkit.parallel.model_split.memory import (
    StageMemory,
    activation_bytes_model,
    measure_stage_memory,
    stage_memory_model,
)
from labkit.parallel.model_split.runtime import ModelSplit, StepResult, split_model
from labkit.parallel.pipeline.split import output_shapes

__all__ = [
    "ModelSplit",
    "StageMemory",
    "StepResult",
    "activation_bytes_model",
    "idle_fraction_theory",
    "idle_fractions",
    "measure_stage_memory",
    "output_shapes",
    "split_model",
    "stage_memory_model",
]
