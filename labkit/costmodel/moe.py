"""Mixture of experts by arithmetic: expert capacity and the bytes expert parallelism moves.

Introduced in notebooks/17_expert_parallel.ipynb.

**Capacity.** An expert processes at most ``C`` tokens of a group per step, so its buffers have
a fixed size: ``C = ⌈k · T · f / E⌉`` for ``T`` tokens, ``E`` experts, top-``k`` routing and a
capacity factor ``f`` (Switch Transformer, Fedus et al. 2021, §2.2: "expert capacity =
tokens per batch / number of experts × capacity factor", ``k = 1``; GShard, Lepikhin et al.
2020, §3.2 and Algorithm 1: ``2N/E`` for top-2). Assignments past ``C`` are dropped.

**Bytes.** Expert parallelism moves tokens with ``all_to_all_single`` in the ep group. Per
MoE layer and rank, forward: the per-expert token counts (``E`` int64), the tokens sent to
the experts (``S`` rows of ``d``), the experts' outputs sent back (``R`` rows, the tokens this
rank's experts received); backward the same two exchanges again, in reverse. Sizes are the
input buffer of each call, as nccl-tests (and ``labkit_record``) count them. Pure arithmetic:
no torch.
"""

from __future__ import annotations

import math

__all__ = ["expert_capacity", "moe_all_to_all_bytes", "uniform_tokens_sent"]


def expert_capacity(
    n_tokens: int, n_experts: int, top_k: int = 1, capacity_factor: float | None = 1.0
) -> int:
    """Tokens one expert may take from a group of ``n_tokens``: ``⌈k · T · f / E⌉``.

    Fedus et al. 2021 (Switch), §2.2, eq. 3 with ``k = 1``; Lepikhin et al. 2020 (GShard),
    Algorithm 1 (``2N/E`` for top-2).

    Args:
        n_tokens: tokens ``T`` in the group (one rank's tokens in expert parallelism).
        n_experts: experts ``E``.
        top_k: experts per token ``k``.
        capacity_factor: ``f``; None for no limit (then ``T``: an expert gets each token at
            most once).

    Returns:
        int: the capacity ``C`` (≥ 1 when ``T`` ≥ 1).

    Raises:
        ValueError: a count < 1 (``n_tokens`` may be 0), ``top_k`` > ``n_experts`` or a
            capacity factor ≤ 0.
    """
    if n_tokens < 0 or n_experts < 1 or not 1 <= top_k <= n_experts:
        raise ValueError(f"need T ≥ 0 and 1 ≤ k ≤ E, got {n_tokens=}, {top_k=}, {n_experts=}")
    if capacity_factor is None:
        return n_tokens
    if capacity_factor <= 0:
        raise ValueError(f"capacity_factor must be > 0 (or None), got {capacity_factor}")
    # round first: 1.25 · 16 / 4 must give 5, not 5.000000000000001 → 6
    return min(n_tokens, math.ceil(round(top_k * n_tokens * capacity_factor / n_experts, 9)))


def moe_all_to_all_bytes(
    tokens_sent: int,
    tokens_received: int,
    d_model: int,
    n_experts: int,
    element_size: int = 4,
    count_size: int = 8,
    backward: bool = True,
) -> list[int]:
    """Each ``all_to_all_single`` of one MoE layer on one rank, in issue order, in bytes.

    Args:
        tokens_sent: ``S``, this rank's token assignments kept within capacity (each goes to
            its expert's rank, its own included).
        tokens_received: ``R``, the assignments this rank's experts received from every rank.
        d_model: the tokens' width ``d``.
        n_experts: experts ``E`` in the layer (one count each is exchanged first).
        element_size: bytes per activation element (4 for float32).
        count_size: bytes per count (8 for int64).
        backward: include the backward's two exchanges.

    Returns:
        list[int]: ``[8E, 4Sd, 4Rd]``, then ``[4Sd, 4Rd]`` for the backward (float32, int64).

    Raises:
        ValueError: a negative count.
    """
    if min(tokens_sent, tokens_received, d_model, n_experts) < 0:
        raise ValueError("counts must be ≥ 0")
    sent, received = tokens_sent * d_model * element_size, tokens_received * d_model * element_size
    forward = [n_experts * count_size, sent, received]
    return forward + [sent, received] if backward else forward


def uniform_tokens_sent(n_tokens: int, top_k: int, ep: int) -> tuple[float, float]:
    """Expected rows a rank sends under uniform routing without drops: all, and off-rank.

    Each of the ``k · T`` assignments lands on a uniformly chosen expert; ``1/ep`` of the
    experts are on this rank, so ``k · T · (ep − 1)/ep`` rows leave it (Lepikhin et al. 2020,
    §3.2: the all-to-all's cost grows with the tokens, not with the experts).

    Args:
        n_tokens: tokens ``T`` on this rank.
        top_k: experts per token ``k``.
        ep: ranks in the expert-parallel group.

    Returns:
        tuple[float, float]: ``(k·T, k·T·(ep − 1)/ep)``.

    Raises:
        ValueError: ``ep`` < 1.
    """
    if ep < 1:
        raise ValueError(f"ep must be ≥ 1, got {ep}")
    total = top_k * n_tokens
    return float(total), total * (ep - 1) / ep
