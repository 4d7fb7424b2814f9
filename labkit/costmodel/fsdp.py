"""How long an FSDP step takes on one link, with and without asynchronous prefetching.

Introduced in notebooks/13_zero_and_fsdp.ipynb.

FSDP2 (``fully_shard``) all-gathers each unit's parameters before its forward and again
before its backward (``reshard_after_forward=True``), and reduce-scatters its gradients after
its backward (Zhao et al. 2023, "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
Parallel", VLDB: its backward and forward prefetching). ``fsdp_step_s`` plays such a step
out on a rank whose collectives share one link that carries one at a time
(``labkit.backends.simlink``), in one of two ways:

- ``async_prefetch=False``: every collective blocks the host until it is done (FSDP2 on the
  CPU, where ``async_op=False`` waits for the work). Prefetching then changes the order of the
  collectives, not the time: ``L (2a + f + b + r)`` for L units.
- ``async_prefetch=True``: the next unit's all-gather is issued without waiting — in forward
  after this unit's all-gather has arrived, in backward before this unit's backward — so it
  runs on the link while the host computes; the reduce-scatters still block.

Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FsdpStepTime", "fsdp_step_s"]


@dataclass(frozen=True)
class FsdpStepTime:
    """Seconds of one modelled FSDP step.

    Attributes:
        forward_s: from the start of forward until the last unit's forward has computed.
        backward_s: from then until the last reduce-scatter has finished.
    """

    forward_s: float
    backward_s: float

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


class _Rank:
    """One host thread and one link: blocking and asynchronous collectives, compute."""

    def __init__(self) -> None:
        self.host = 0.0  # when the host is free
        self.link = 0.0  # when the link is free

    def issue(self, seconds: float) -> float:
        """Start a collective when both host and link are free; return when it ends."""
        self.link = max(self.host, self.link) + seconds
        return self.link

    def block(self, seconds: float) -> None:
        self.host = self.issue(seconds)

    def wait(self, end: float) -> None:
        self.host = max(self.host, end)

    def compute(self, seconds: float) -> None:
        self.host += seconds


def fsdp_step_s(
    n_units: int,
    forward_s: float,
    backward_s: float,
    all_gather_s: float,
    reduce_scatter_s: float,
    async_prefetch: bool = False,
) -> FsdpStepTime:
    """The time of one FSDP step of ``n_units`` equal units whose collectives share one link.

    Every unit is resharded after forward (all-gathered again in backward); the root holds
    no parameters. Per unit: forward ``f``, backward ``b``, all-gather ``a``, reduce-scatter
    ``r`` seconds. Without asynchronous prefetch every collective blocks the host:
    ``L (a + f)`` forward and ``L (a + b + r)`` backward. With it, unit i+1's all-gather is
    issued as soon as unit i's has arrived (forward) and unit i−1's right after unit i's has
    arrived (backward, FSDP's default backward prefetch), each starting when the link is free;
    a unit waits for its own all-gather before computing, and the reduce-scatters block.

    Args:
        n_units: FSDP units L (at least 1).
        forward_s: one unit's forward compute, seconds.
        backward_s: one unit's backward compute, seconds.
        all_gather_s: one unit's all-gather on the link, seconds.
        reduce_scatter_s: one unit's reduce-scatter on the link, seconds.
        async_prefetch: issue prefetched all-gathers without blocking the host.

    Returns:
        FsdpStepTime: forward and backward seconds (``.total_s``).

    Raises:
        ValueError: ``n_units < 1`` or a negative time.
    """
    if n_units < 1:
        raise ValueError(f"n_units must be >= 1, got {n_units}")
    times = (forward_s, backward_s, all_gather_s, reduce_scatter_s)
    if any(t < 0 for t in times):
        raise ValueError(f"times must be >= 0, got {times}")
    rank = _Rank()
    pending: dict[int, float] = {}  # unit -> when its prefetched all-gather ends

    def gather(unit: int) -> None:  # the unit's own all-gather, waited for at once
        rank.wait(pending.pop(unit)) if unit in pending else rank.block(all_gather_s)

    def prefetch(unit: int) -> None:
        if async_prefetch:
            pending[unit] = rank.issue(all_gather_s)
        else:
            rank.block(all_gather_s)
            pending[unit] = rank.host

    for unit in range(n_units):
        gather(unit)
        if unit + 1 < n_units and async_prefetch:  # blocking forward prefetch changes nothing
            prefetch(unit + 1)
        rank.compute(forward_s)
    end_forward = rank.host
    for unit in reversed(range(n_units)):
        gather(unit)
        if unit > 0:
            prefetch(unit - 1)
        rank.compute(backward_s)
        rank.block(reduce_scatter_s)
    return FsdpStepTime(end_forward, rank.host - end_forward)
