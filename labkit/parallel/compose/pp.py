"""``apply_pp``: cut a model into pipeline stages, keep this rank's, run the 1F1B schedule on it.

Introduced in notebooks/18_hybrid_parallel.ipynb (the runtime is notebook 11's).

torchtitan splits first (``pipeline_llama``), then parallelizes each stage like a whole
model. Here ``apply_pp`` cuts an ``nn.Sequential`` into consecutive runs of layers
(``split_sequential``, or a model's own split such as the capstone's ``gpt_stages``), keeps
the stage of this rank's pp coordinate and drops the rest; a ``PipelineStage`` remembers where
its layers sit in the whole model, so names, plans and checkpoints keep the unsplit model's
names. Each step runs ``one_f_one_b`` over ``run_schedule`` on the pp group; the data-parallel
reduction of the stage's gradients waits for the last micro-batch (``no_sync`` around the
schedule, then one ``reduce_gradients``): one round per optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.compose.sync import no_sync, reduce_gradients
from labkit.parallel.pipeline.p2p import Exchange
from labkit.parallel.pipeline.runtime import run_schedule
from labkit.parallel.pipeline.schedules import one_f_one_b
from labkit.parallel.pipeline.split import output_shapes, split_sequential

__all__ = ["PipelineStage", "apply_pp"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Context = Callable[[], contextlib.AbstractContextManager] | None


class PipelineStage:
    """This rank's stage: its layers, their place in the model, and one schedule step.

    Args:
        layers: the stage, consecutive layers ``first_layer ..`` of the whole model.
        index: this stage's number (the rank's pp coordinate).
        n_stages: stages in the pipeline (the pp degree).
        group: the pp group (its rank ``s`` holds stage ``s``).
        microbatches: m, micro-batches per step (1F1B needs m ≥ 1).
        sample_shapes: every stage's output shape for one sample (without the batch dim).
        first_layer: index in the whole model of this stage's first layer.
        timeout_s: the longest a receive may wait.

    Attributes:
        module: what runs the stage's forward: ``layers``, or the data-parallel wrapper
            ``parallelize`` puts around it (its gradients are reduced by ``step``).
    """

    def __init__(
        self,
        layers: nn.Sequential,
        index: int,
        n_stages: int,
        group: dist.ProcessGroup,
        microbatches: int,
        sample_shapes: list[tuple[int, ...]],
        first_layer: int,
        timeout_s: float = 300.0,
    ) -> None:
        self.layers, self.module = layers, layers
        self.index, self.n_stages, self.group = index, n_stages, group
        self.microbatches, self.sample_shapes = microbatches, sample_shapes
        self.first_layer, self.timeout_s = first_layer, timeout_s
        self.schedule = one_f_one_b(n_stages, microbatches)

    @property
    def is_last(self) -> bool:
        """Whether this stage computes the loss."""
        return self.index == self.n_stages - 1

    def global_name(self, name: str) -> str:
        """``"0.attn.q.weight"`` of the stage → ``"3.attn.q.weight"`` of the whole model."""
        i, _, rest = name.partition(".")
        return f"{self.first_layer + int(i)}.{rest}" if rest else str(self.first_layer + int(i))

    def local_names(self, names: dict[str, Any]) -> dict[str, Any]:
        """The entries of ``names`` (keys named in the whole model) that live in this stage,
        renamed to the stage's own numbering (a tp plan, the blocks to checkpoint)."""
        out = {}
        for key, value in names.items():
            i, _, rest = key.partition(".")
            k = int(i) - self.first_layer
            if 0 <= k < len(self.layers):
                out[f"{k}.{rest}" if rest else str(k)] = value
        return out

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        # Receive buffers take the input's dtype: integer ids (tokens) travel as floats.
        return x if x.is_floating_point() else x.to(torch.get_default_dtype())

    def step(
        self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, forward_context: Context = None
    ) -> float | None:
        """One optimizer step's forwards and backwards through the pipeline; gradients reduced.

        Args:
            x, y: this rank's share of the batch (the same on every rank of the pp group).
            loss_fn: mean over a micro-batch (the runtime divides by m).
            forward_context: entered around each forward (e.g. bf16 autocast).

        Returns:
            The batch's mean loss on the last stage, else None.

        Raises:
            ValueError: the batch is not divisible by the micro-batch count.
        """
        m = self.microbatches
        if x.shape[0] % m:
            raise ValueError(f"batch {x.shape[0]} is not divisible by {m} micro-batches")
        b = x.shape[0] // m
        shapes = [(b, *s) for s in self.sample_shapes]
        xs, ys = list(self._inputs(x).chunk(m)), list(y.chunk(m))
        with no_sync(self.module):  # one reduction per step, after the last micro-batch
            result = run_schedule(
                self.schedule,
                {self.index: self.module},
                xs,
                ys,
                loss_fn,
                shapes,
                group=self.group,
                timeout_s=self.timeout_s,
                forward_context=forward_context,
            )
        reduce_gradients(self.module)
        return result.loss if self.is_last else None

    @torch.no_grad()
    def evaluate(
        self, x: torch.Tensor, y: torch.Tensor, loss_fn: LossFn, forward_context: Context = None
    ) -> float | None:
        """The loss of one forward of the whole batch through the stages (no gradients).

        Args:
            x, y: this rank's share of the batch (the same on every rank of the pp group).
            loss_fn: the mean loss of a batch.
            forward_context: entered around the forward (e.g. bf16 autocast).

        Returns:
            The loss on the last stage, else None.
        """
        ex = Exchange(self.group, timedelta(seconds=self.timeout_s))
        h = self._inputs(x)
        if self.index > 0:
            shape = (x.shape[0], *self.sample_shapes[self.index - 1])
            h = ex.recv(torch.empty(shape, dtype=h.dtype, device=h.device), self.index - 1)
        with (forward_context or contextlib.nullcontext)():
            out = self.module(h)
            loss = loss_fn(out, y) if self.is_last else None
        if not self.is_last:
            ex.send(out.to(h.dtype), self.index + 1)
        ex.finish()
        return None if loss is None else float(loss)


def apply_pp(
    model: nn.Sequential,
    pp: Any,
    microbatches: int,
    example: torch.Tensor,
    split: Callable[[nn.Sequential, int], list[nn.Sequential]] = split_sequential,
    timeout_s: float = 300.0,
) -> PipelineStage:
    """Cut ``model`` into as many stages as the pp group has ranks; keep this rank's.

    Args:
        model: the whole model, the same on every rank (its other stages are left to be freed).
        pp: the pipeline ``DeviceMesh`` (1-D, e.g. ``mesh["pp"]``) or its ``ProcessGroup``.
        microbatches: m, micro-batches per step.
        example: one input (any batch size) to find every stage's output shape, as
            ``torch.distributed.pipelining`` infers them; run through the whole model once.
        split: ``split(model, n_stages)`` → the stages, consecutive layers of ``model`` in
            order (default ``split_sequential``: equal counts).
        timeout_s: the longest a receive may wait.

    Returns:
        This rank's ``PipelineStage``.

    Raises:
        ValueError: a split whose stages are not consecutive layers of ``model``, or m < 1.
    """
    group = pp if isinstance(pp, dist.ProcessGroup) else pp.get_group()
    n, r = dist.get_world_size(group), dist.get_rank(group)
    if microbatches < 1:
        raise ValueError(f"microbatches must be >= 1, got {microbatches}")
    stages = split(model, n)
    first, layers = [], list(model)
    for s in stages:
        first.append(sum(len(t) for t in stages[: len(first)]))
        if [id(m) for m in s] != [id(m) for m in layers[first[-1] : first[-1] + len(s)]]:
            raise ValueError("each stage must hold consecutive layers of the model, in order")
    inputs = example if example.is_floating_point() else example.to(torch.get_default_dtype())
    sample = [tuple(s[1:]) for s in output_shapes(stages, inputs)]
    return PipelineStage(stages[r], r, n, group, microbatches, sample, first[r], timeout_s)
