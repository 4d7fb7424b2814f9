"""One rank's stage of a model split over send/recv: forward, backward, step.

Introduced in notebooks/10_model_parallel.ipynb.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from labkit.parallel.pipeline.split import split_sequential
from labkit.trace import COMM, span

__all__ = ["ModelSplit", "StepResult", "split_model"]

# One message per step and direction between neighbours (r → r+1 activations, r+1 → r
# gradients), so plain tag-0 send/recv match in order, on gloo and NCCL alike. The p2p is
# safe on NCCL without batching: a rank never has a send and a receive outstanding at once,
# and it only ever waits for the neighbour the data comes from (r-1 in forward, r+1 in
# backward), so the waits form a chain 0 → p-1 → 0 and never a cycle, even while NCCL
# creates the pair's communicator at its first message. Every send and receive waits at
# most ``timeout_s`` (tests/test_pipeline_p2p.py checks the order).


def split_model(
    model: nn.Sequential, n_stages: int, bounds: Sequence[int] | None = None
) -> list[nn.Sequential]:
    """Cut ``model`` into ``n_stages`` consecutive stages, evenly or at the given boundaries.

    Args:
        model: the layers, in order.
        n_stages: how many stages (= ranks).
        bounds: ``[0, a_1, …, len(model)]``: stage ``s`` holds layers ``[a_s, a_{s+1})``.
            Default: as equal in layer count as possible (``split_sequential``).

    Returns:
        list[nn.Sequential]: the stages, sharing their layers (not copies) with ``model``.

    Raises:
        ValueError: more stages than layers, or bounds that are not ``n_stages + 1``
            increasing indices from 0 to ``len(model)``.
    """
    if bounds is None:
        return split_sequential(model, n_stages)
    b, n = list(bounds), len(model)
    pairs = list(zip(b[:-1], b[1:], strict=True))
    if len(b) != n_stages + 1 or b[0] != 0 or b[-1] != n or any(x >= y for x, y in pairs):
        raise ValueError(
            f"bounds {b} do not cut {n} layers into {n_stages} non-empty stages: need "
            f"{n_stages + 1} increasing indices from 0 to {n}"
        )
    return [nn.Sequential(*[model[i] for i in range(x, y)]) for x, y in pairs]


@dataclass
class StepResult:
    """What one rank did in one step: loss (last stage, else None), messages and bytes it
    sent, bytes of activations its stage kept for the backward (measured)."""

    loss: float | None
    n_sends: int
    bytes_sent: int
    activation_bytes: int


class ModelSplit:
    """This rank's stage of a model split across the ranks of ``group``: forward, backward, step.

    Args:
        stage: this rank's layers (rank ``r`` of ``group`` runs stage ``r``).
        shapes: ``shapes[s]`` is stage ``s``'s output shape for the batch, agreed by every
            rank (``output_shapes(stages, x)``); one entry per rank of ``group``.
        loss_fn: ``loss_fn(output, target)`` on the last stage.
        group: the process group the stages live in (None: the default group).
        dtype: dtype of the activations and gradients on the wire.
        device: where received tensors go (default: the stage's parameters' device, or cpu).
        timeout_s: the longest any send or receive may wait.

    Raises:
        ValueError: ``shapes`` does not have one entry per rank of ``group``.
    """

    def __init__(
        self,
        stage: nn.Module,
        shapes: Sequence[Sequence[int]],
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        group: dist.ProcessGroup | None = None,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.group, self.stage, self.loss_fn = group, stage, loss_fn
        self.pp_rank, self.pp_world_size = dist.get_rank(group), dist.get_world_size(group)
        if len(shapes) != self.pp_world_size:
            raise ValueError(
                f"{len(shapes)} agreed shapes for {self.pp_world_size} ranks: need one "
                "output shape per stage"
            )
        self.shapes = [tuple(s) for s in shapes]
        first = next(iter(stage.parameters()), None)
        self.device = torch.device(device or (first.device if first is not None else "cpu"))
        self.dtype, self.timeout = dtype, timedelta(seconds=timeout_s)
        self.input: torch.Tensor | None = None  # kept from forward for backward
        self.output: torch.Tensor | None = None  # the output (the loss on the last stage)
        self.activation_bytes = 0
        self.n_sends = self.bytes_sent = 0

    is_first = property(lambda self: self.pp_rank == 0)
    is_last = property(lambda self: self.pp_rank == self.pp_world_size - 1)

    def send(self, t: torch.Tensor, dst: int) -> None:
        """Send ``t`` to rank ``dst`` of the group and wait, at most ``timeout_s``."""
        t = t.detach().to(self.dtype).contiguous()
        dist.isend(t, group=self.group, group_dst=dst).wait(self.timeout)
        self.n_sends += 1
        self.bytes_sent += t.numel() * t.element_size()

    def recv(self, shape: Sequence[int], src: int) -> torch.Tensor:
        """Receive a tensor of the agreed ``shape`` from rank ``src``, at most ``timeout_s``."""
        buf = torch.empty(tuple(shape), dtype=self.dtype, device=self.device)
        with span("recv", kind=COMM, device=buf.device, peer=src):
            dist.irecv(buf, group=self.group, group_src=src).wait(self.timeout)
        return buf

    def forward(
        self, x: torch.Tensor | None = None, target: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run this stage forward: take ``x`` (stage 0) or receive it, send the output on.

        Args:
            x: the batch, on stage 0 only; ``target``: the targets, on the last stage only.

        Returns:
            torch.Tensor: the stage's output (the loss on the last stage).

        Raises:
            ValueError: ``x`` or ``target`` missing where needed, or this stage's output
                does not have the agreed shape (nothing is sent then).
        """
        r = self.pp_rank
        if self.is_first:
            if x is None:
                raise ValueError("stage 0 needs the batch x")
            inp = x
        else:
            inp = self.recv(self.shapes[r - 1], r - 1).requires_grad_(True)
        if self.is_last and target is None:
            raise ValueError(f"the last stage ({r}) needs the target")
        saved = _SavedBytes(self.stage)
        with saved, span("forward", device=inp.device, stage=r, op="F"):
            try:
                out = self.stage(inp)
            except RuntimeError as exc:
                raise ValueError(
                    f"stage {r} cannot run on its input of shape {tuple(inp.shape)}: {exc}"
                ) from exc
        if not self.is_last and tuple(out.shape) != self.shapes[r]:
            raise ValueError(
                f"stage {r} produced shape {tuple(out.shape)} but the agreed shape is "
                f"{self.shapes[r]}: stage {r + 1} would receive the wrong number of bytes"
            )
        self.activation_bytes = saved.total([inp, out])
        if self.is_last:
            out = self.loss_fn(out, target)
        else:
            self.send(out, r + 1)
        self.input, self.output = inp, out
        return out

    def backward(self) -> None:
        """Receive the output's gradient (unless last), backward, send the input's gradient.

        Raises:
            RuntimeError: called before ``forward``.
        """
        if self.output is None or self.input is None:
            raise RuntimeError("backward() needs a forward() first")
        r, out, inp = self.pp_rank, self.output, self.input
        grad = None if self.is_last else self.recv(self.shapes[r], r + 1)
        with span("backward", device=out.device, stage=r, op="B"):
            torch.autograd.backward(out, grad)  # parameter grads accumulate; inp.grad is set
        if not self.is_first:
            self.send(inp.grad, r - 1)
        self.input = self.output = None  # the activations are free now

    def step(self, x: torch.Tensor | None = None, target: torch.Tensor | None = None) -> StepResult:
        """One training step's forward and backward (gradients accumulate; zero them before).

        Args:
            x: the batch, on stage 0 only; ``target``: the targets, on the last stage only.

        Returns:
            StepResult: loss (last stage), messages and bytes this rank sent, activations kept.
        """
        sends, sent = self.n_sends, self.bytes_sent
        out = self.forward(x, target)
        loss = float(out.detach()) if self.is_last else None
        kept = self.activation_bytes
        self.backward()
        return StepResult(loss, self.n_sends - sends, self.bytes_sent - sent, kept)


class _SavedBytes(torch.autograd.graph.saved_tensors_hooks):
    """Bytes of the distinct tensors autograd saves for backward, parameters left out.

    A tensor counts its own elements (a view of a larger batch counts the view), and tensors
    starting at the same address count once, the largest of them.
    """

    def __init__(self, module: nn.Module) -> None:
        self.params = {p.data_ptr() for p in module.parameters()}
        self.kept: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.data_ptr() not in self.params:
                self._add(t)
            return t

        super().__init__(pack, lambda t: t)

    def _add(self, t: torch.Tensor) -> None:
        self.kept[t.data_ptr()] = max(self.kept.get(t.data_ptr(), 0), t.numel() * t.element_size())

    def total(self, also: Sequence[torch.Tensor]) -> int:
        """Saved bytes plus ``also`` (the stage's input and output, kept for the backward)."""
        for t in also:
            self._add(t)
        return sum(self.kept.values())
