"""Collectives of tensor vs sequence parallelism per transformer block and step (counts only).

Introduced in notebooks/15_sequence_parallel.ipynb.

Shoeybi et al. 2019, §3: a tensor-parallel block all-reduces its activations twice in forward
(``g`` after the attention and after the MLP) and once per column-parallel input in backward
(``f``: two with a fused QKV layer, four with labkit's separate q, k, v). Korthikanti et al.
2022, §4.2.2: sequence parallelism replaces each all-reduce by a reduce-scatter and an
all-gather on either side of the LayerNorm region. Every one of these moves an activation of
b·s·h elements (as nccl-tests counts an all-gather's or a reduce-scatter's size: the whole
gathered buffer), and a ring all-reduce is a reduce-scatter then an all-gather, so the bytes
each rank sends are the same: (p−1)/p·N per all-gather or reduce-scatter, 2(p−1)/p·N per
all-reduce (``labkit.costmodel.busbw_factor``). Pure arithmetic.
"""

from __future__ import annotations

__all__ = ["sequence_parallel_collectives", "tensor_parallel_collectives"]


def _blocks(n_blocks: int) -> int:
    if isinstance(n_blocks, bool) or not isinstance(n_blocks, int) or n_blocks < 1:
        raise ValueError(f"n_blocks must be an int >= 1, got {n_blocks!r}")
    return n_blocks


def tensor_parallel_collectives(
    n_blocks: int = 1, fused_qkv: bool = False
) -> dict[str, dict[str, int]]:
    """All-reduces of b·s·h elements of ``n_blocks`` tensor-parallel transformer blocks, one step.

    Shoeybi et al. 2019, §3 ("two all-reduce operations in the forward path and two in the
    backward path" per layer, with a fused QKV); a block's input gradient is needed because of
    the LayerNorm before its first column-parallel layer.

    Args:
        n_blocks: transformer blocks.
        fused_qkv: one QKV layer (Megatron-LM) instead of separate q, k, v (``labkit.models``).

    Returns:
        dict: ``{"forward": {"all_reduce": 2n}, "backward": {"all_reduce": 2n or 4n}}``.

    Raises:
        ValueError: n_blocks < 1.
    """
    n = _blocks(n_blocks)
    return {
        "forward": {"all_reduce": 2 * n},
        "backward": {"all_reduce": (2 if fused_qkv else 4) * n},
    }


def sequence_parallel_collectives(
    n_blocks: int = 1, regather: bool = True, region: bool = False
) -> dict[str, dict[str, int]]:
    """Collectives of ``n_blocks`` sequence-parallel blocks in one step, by phase.

    Korthikanti et al. 2022, §4.2.2, Figure 5. Per block:

    - forward: an all-gather into the attention and into the MLP, a reduce-scatter out of each;
    - backward: their conjugates (a reduce-scatter per all-gather, an all-gather per
      reduce-scatter: q, k and v read one gathered tensor, so their gradients are summed before
      one reduce-scatter), plus, with ``regather``, the all-gather of each kept input again;
    - after backward: one all-reduce of the LayerNorms' and row biases' partial gradients
      (6h elements per block, coalesced; not b·s·h).

    Args:
        n_blocks: transformer blocks.
        regather: the GEMM inputs are kept as this rank's tokens and gathered again (Megatron).
        region: the blocks also enter (scatter: an all-gather of the input's gradient in
            backward, when the input needs one) and leave (an all-gather in forward) the region.

    Returns:
        dict: ``{"forward": {...}, "backward": {...}, "after_backward": {"all_reduce": 1}}``,
        op → count, each all-gather and reduce-scatter of b·s·h elements.

    Raises:
        ValueError: n_blocks < 1.
    """
    n = _blocks(n_blocks)
    fwd_ag = 2 * n + (1 if region else 0)
    bwd_ag = 2 * n + (2 * n if regather else 0) + (1 if region else 0)
    return {
        "forward": {"all_gather": fwd_ag, "reduce_scatter": 2 * n},
        "backward": {"all_gather": bwd_ag, "reduce_scatter": 2 * n},
        "after_backward": {"all_reduce": 1},
    }
