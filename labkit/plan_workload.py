"""What the step-time model needs to know about a model: its layers, their units and their cost.

Introduced in notebooks/21_capstone.ipynb.

A ``Workload`` describes one training step of a layered model (an ``nn.Sequential`` such as
TinyGPT) as pure numbers, so ``labkit.plan_time`` prices every strategy without a process:

- per layer: the parameters of each *unit* (a module with parameters of its own: ZeRO and
  FSDP2 gather and reduce once per unit), how many tensors it holds, its forward and backward
  time as ``a + c·tokens`` (calibrated on this machine by timing the model's own layers:
  ``labkit.capstone.calibrate_workload``), which of its linear layers tensor parallelism
  splits by columns and by rows (one all-reduce each, Megatron's ``f`` and ``g``), and how
  wide its output is (the activation a pipeline stage sends on);
- per step: the batch, the sequence length, Adam's cost per tensor and per element, and what a
  step costs beyond its layers and its optimizer (Python: zero_grad, clipping, the schedule);
- per strategy: what its own code costs beyond all that (ZeRO's packing and unpacking per
  unit, FSDP2's hooks and copies, DTensor's dispatch), timed on one process with every
  collective removed (``labkit.bench_framework``), and per sharded flavour that cost per
  unit collective, for strategies that were not timed.

Pure arithmetic, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["LayerCost", "Workload", "framework_key", "transformer_workload"]


def framework_key(
    dp: int, pp: int, tp: int, zero_stage: int = 0, fsdp: bool = False, microbatches: int = 1
) -> tuple[int, int, int, int, bool, int]:
    """The key of a strategy in ``Workload.framework``: its degrees, its ZeRO stage (0 where
    dp is 1), FSDP2 or not, and its micro-batches."""
    return (dp, pp, tp, zero_stage if dp > 1 else 0, bool(fsdp), microbatches)


@dataclass(frozen=True)
class LayerCost:
    """One layer of the model.

    Args:
        name: a label (``"embed"``, ``"block"``, ``"head"``).
        units: per unit, the element counts of its parameters.
        forward: ``(a, c)``: a forward of N tokens takes a + c·N seconds.
        backward: ``(a, c)`` of its backward.
        block: a repeated block (pipelines split the blocks evenly; the layers before the
            first block join the first stage, those after the last one the last stage).
        tp_colwise: column-parallel linear layers under tensor parallelism (each all-reduces
            its input's gradient in backward).
        tp_rowwise: row-parallel linear layers (each all-reduces its output in forward).
        tp_split: parameters tensor parallelism splits (the rest stays whole on each rank).
        width: activation elements per token this layer outputs.
    """

    name: str
    units: tuple[tuple[int, ...], ...]
    forward: tuple[float, float]
    backward: tuple[float, float]
    block: bool = False
    tp_colwise: int = 0
    tp_rowwise: int = 0
    tp_split: int = 0
    width: int = 0

    @property
    def numel(self) -> int:
        """Parameters of the layer."""
        return sum(sum(u) for u in self.units)

    @property
    def tensors(self) -> int:
        """Parameter tensors of the layer."""
        return sum(len(u) for u in self.units)

    def time_s(self, tokens: float, tp: int = 1) -> tuple[float, float]:
        """``(forward, backward)`` seconds for ``tokens`` tokens; under tensor parallelism of
        degree ``tp`` a block's per-token work is split over the ranks, its per-call part is
        not."""
        split = 1 / tp if (self.block and tp > 1) else 1.0
        (af, cf), (ab, cb) = self.forward, self.backward
        return af + cf * tokens * split, ab + cb * tokens * split

    def local_numel(self, tp: int = 1) -> float:
        """Parameters one tensor-parallel rank holds."""
        return self.numel - self.tp_split + self.tp_split / tp


@dataclass(frozen=True)
class Workload:
    """One training step of a layered model, as numbers.

    Args:
        layers: the layers in order.
        batch: B, sequences per optimizer step (all ranks together).
        seq_len: T, tokens per sequence.
        element_bytes: bytes of a parameter, a gradient or an activation element (4: fp32).
        adam: ``(per tensor, per element)`` seconds of one Adam step.
        step_overhead_s: one step's time beyond its layers and Adam, on one process.
        bucket_cap_bytes: DDP's bucket cap (labkit's ``DataParallelBucketed``: 25 MiB).
        name: a label.
        framework: per strategy (``framework_key``), seconds of one step of its own code
            beyond its layers, Adam and ``step_overhead_s``, on one process, one thread.
        unit_call_s: per sharded flavour (``"zero1"`` … ``"zero3"``, ``"fsdp"``), those
            seconds per unit collective: the price of a strategy not in ``framework``.

    Raises:
        ValueError: no layers, or a batch or length below 1.
    """

    layers: tuple[LayerCost, ...]
    batch: int
    seq_len: int
    element_bytes: int = 4
    adam: tuple[float, float] = (0.0, 0.0)
    step_overhead_s: float = 0.0
    bucket_cap_bytes: int = 25 << 20
    name: str = "model"
    framework: Mapping[tuple[int, int, int, int, bool, int], float] = field(default_factory=dict)
    unit_call_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers or self.batch < 1 or self.seq_len < 1:
            raise ValueError(
                f"need layers, batch >= 1 and seq_len >= 1; got {len(self.layers)} layers, "
                f"batch {self.batch}, seq_len {self.seq_len}"
            )

    @property
    def numel(self) -> int:
        """Ψ, parameters of the whole model."""
        return sum(layer.numel for layer in self.layers)

    @property
    def n_blocks(self) -> int:
        """Repeated blocks (what a pipeline splits)."""
        return sum(layer.block for layer in self.layers)

    def stages(self, pp: int) -> list[list[int]]:
        """The layer indices of each of ``pp`` stages: the blocks split evenly, the layers
        before the first block in the first stage and those after the last in the last
        (Megatron-LM's placement; ``labkit.capstone.gpt_stages`` cuts TinyGPT so).

        Raises:
            ValueError: ``pp`` does not divide the number of blocks.
        """
        blocks = [i for i, layer in enumerate(self.layers) if layer.block]
        if pp < 1 or not blocks or len(blocks) % pp:
            raise ValueError(f"pp({pp}) must divide the {len(blocks)} blocks")
        k = len(blocks) // pp
        cuts = [blocks[s * k] for s in range(1, pp)]
        bounds = [0, *cuts, len(self.layers)]
        return [list(range(a, b)) for a, b in zip(bounds, bounds[1:], strict=False)]

    def units(self, layers: list[int]) -> list[tuple[int, ...]]:
        """The units of the given layers, in order."""
        return [u for i in layers for u in self.layers[i].units]

    def buckets(self, layers: list[int], tp: int = 1) -> list[float]:
        """Bytes of each DDP bucket of these layers' gradients (filled in reverse order, as
        gradients become ready, up to ``bucket_cap_bytes``; Li et al. 2020, §3.2.3)."""
        out, size = [], 0.0
        for i in reversed(layers):
            add = self.layers[i].local_numel(tp) * self.element_bytes
            if size and size + add > self.bucket_cap_bytes:
                out.append(size)
                size = 0.0
            size += add
        return [*out, size] if size else out

    def tensors(self, layers: list[int]) -> int:
        """Parameter tensors of these layers."""
        return sum(self.layers[i].tensors for i in layers)

    def local_numel(self, layers: list[int], tp: int = 1) -> float:
        """Parameters of these layers one tensor-parallel rank holds."""
        return math.fsum(self.layers[i].local_numel(tp) for i in layers)


def transformer_workload(
    vocab_size: int,
    dim: int,
    n_layers: int,
    seq_len: int,
    batch: int,
    flops: float,
    element_bytes: int = 4,
    name: str = "GPT",
) -> Workload:
    """A TinyGPT-shaped transformer priced by FLOPs alone: the what-if where nothing is measured.

    Layers and units as ``lk.models.TinyGPT``'s (embedding: token and position tables; per
    block two LayerNorms, q, k, v, the projection, the MLP's two layers; the head: a
    LayerNorm and the vocabulary projection). Forward FLOPs per token: 2 per weight of a
    matrix product (24h² per block, 2Vh for the head) plus attention's 4Th (QKᵀ and AV);
    backward twice the forward (Kaplan et al. 2020, §2.1), at ``flops`` per second, with no
    per-call part.

    Args:
        vocab_size: V; dim: h; n_layers: L; seq_len: T; batch: B.
        flops: sustained FLOP/s of one device (a GPU's, e.g. 300e12 on an A100 in bf16).
        element_bytes: bytes of a parameter, a gradient, an activation element.
        name: a label.

    Returns:
        The ``Workload``.
    """
    V, h, T = vocab_size, dim, seq_len
    ln, lin = (h, h), (h * h, h)
    block_flops = 2 * 12 * h * h + 4 * T * h

    def layer(name, units, per_token, block=False, **tp) -> LayerCost:
        c = per_token / flops
        return LayerCost(name, units, (0.0, c), (0.0, 2 * c), block=block, width=h, **tp)

    split = 3 * (h * h + h) + (4 * h * h + 4 * h) + h * h + 4 * h * h  # q, k, v, fc1; proj, fc2
    block = layer(
        "block",
        (ln, ln, lin, lin, lin, lin, (4 * h * h, 4 * h), (4 * h * h, h)),  # TinyGPT's order
        block_flops,
        block=True,
        tp_colwise=4,
        tp_rowwise=2,
        tp_split=split,
    )
    embed = layer("embed", ((V * h,), (T * h,)), 0.0)
    head = layer("head", (ln, (V * h,)), 2 * V * h)
    return Workload(
        (embed, *[block] * n_layers, head), batch, T, element_bytes=element_bytes, name=name
    )
