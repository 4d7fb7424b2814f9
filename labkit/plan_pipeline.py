"""The time of one 1F1B pipeline step, by playing the schedule through: stages, hops, bubble.

Introduced in notebooks/21_capstone.ipynb.

The bubble formula (p − 1)/(m + p − 1) (GPipe, Huang et al. 2019, §2.3) assumes equal stages
and free hops. Real stages differ (TinyGPT's first stage holds the embedding, its last the
head and the loss) and every hop costs a message. ``pipeline_time`` plays 1F1B (Narayanan et
al. 2021, §2.1: stage s runs min(p − 1 − s, m) warm-up forwards, then one forward and one
backward in turn, then the remaining backwards; ``labkit.parallel.pipeline.one_f_one_b``'s
order) with each stage's own forward and backward time: an action starts when its stage is
free and its input has arrived (the forward of the stage before, or the backward of the
stage after, plus one hop). With equal stages and free hops it gives (m + p − 1)(F + B),
the formula's step. A hop may cost more while the other ranks compute (``hop_s`` as a
function of how many do): with more ranks than cores, a receiver that waits for its message
must also wait for a core. And receiving a message is work on the same cores as the
stages' compute (``receiving_computes``): a hop slows the stages that compute meanwhile.

Pure arithmetic, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["PipelineTime", "one_f_one_b_order", "pipeline_time"]


def one_f_one_b_order(n_stages: int, stage: int, m: int) -> list[tuple[str, int]]:
    """Stage ``stage``'s actions under 1F1B: ``[("F", 0), ..., ("B", m − 1)]``.

    Raises:
        ValueError: a stage outside the pipeline or m < 1.
    """
    if not 0 <= stage < n_stages or m < 1:
        raise ValueError(f"need 0 <= stage < {n_stages} and m >= 1, got {stage}, {m}")
    warmup = min(n_stages - 1 - stage, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", i + warmup), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


@dataclass(frozen=True)
class PipelineTime:
    """``pipeline_time``'s result.

    Attributes:
        step_s: from the first forward's start to the last backward's end.
        busy_s: per stage, the time it computed.
        idle_s: per stage, step_s − busy_s: its share of the bubble (hops included).
    """

    step_s: float
    busy_s: tuple[float, ...]

    @property
    def idle_s(self) -> tuple[float, ...]:
        return tuple(self.step_s - b for b in self.busy_s)


def pipeline_time(
    forward_s: Sequence[float],
    backward_s: Sequence[float],
    m: int,
    hop_s: float | Callable[[int], float] = 0.0,
    share: Callable[[int], float] | None = None,
    copies: int = 1,
    receiving_computes: bool = False,
) -> PipelineTime:
    """Play 1F1B over stages with the given per-micro-batch times.

    With ``share``, ranks that compute at the same moment share the machine: while k ranks
    compute (``copies`` pipelines side by side, e.g. dp replicas, times the busy stages),
    each progresses at 1/share(k) of its own speed — a bubble on one stage frees the cores
    for the others, which is why a pipeline of more ranks than cores loses less to sharing
    than data parallelism does.

    Args:
        forward_s: per stage, one micro-batch's forward (seconds, on a rank alone).
        backward_s: per stage, one micro-batch's backward.
        m: micro-batches.
        hop_s: the time from the end of an action to its output's arrival at the next stage
            (a message: activations forward, their gradients backward); or a function of
            the ranks computing when the message leaves (the other stages that run, times
            ``copies``) to that time.
        share: k ranks computing at once → how much slower each runs (None: no sharing).
        copies: identical pipelines running at the same time (their ranks share too).
        receiving_computes: with ``share``, a stage whose input is on its way counts among
            the ranks computing: receiving a message (the socket's reads, the wake-up) takes
            the same cores, so a hop does not free them for the other stages.

    Returns:
        A ``PipelineTime`` (``busy_s``: the work each stage did, at its own speed).

    Raises:
        ValueError: stages of different counts, none, or m < 1.
    """
    p = len(forward_s)
    if p < 1 or len(backward_s) != p or m < 1:
        raise ValueError(f"need as many forward as backward times (>= 1) and m >= 1, got {p}")
    slow = share or (lambda k: 1.0)
    orders = [one_f_one_b_order(p, s, m) for s in range(p)]
    end: dict[tuple[str, int, int], float] = {}  # (op, stage, micro-batch) -> end time
    hops: dict[tuple[str, int, int], float] = {}  # -> the hop its output takes
    hop_of = hop_s if callable(hop_s) else (lambda k: hop_s)
    nxt, running, now = [0] * p, {}, 0.0  # running: stage -> [key, work left]

    def arrival(s: int) -> float | None:
        """When stage s's next action can start (its input there), None if not yet known."""
        op, i = orders[s][nxt[s]]
        dep = ("F", s - 1, i) if op == "F" else (("B", s + 1, i) if s < p - 1 else ("F", s, i))
        if op == "F" and s == 0:
            return 0.0
        if dep not in end:
            return None
        return end[dep] + (hops[dep] if dep[1] != s else 0.0)

    def waiting(running: dict) -> list[float]:
        """When the input of each stage that waits arrives, where its sender has finished."""
        return [a for s in range(p) if s not in running and nxt[s] < len(orders[s])
                if (a := arrival(s)) is not None]  # fmt: skip

    while True:
        for s in range(p):  # start what can start now
            if s not in running and nxt[s] < len(orders[s]):
                ready = arrival(s)
                if ready is not None and ready <= now:
                    op, i = orders[s][nxt[s]]
                    running[s] = [(op, s, i), forward_s[s] if op == "F" else backward_s[s]]
                    nxt[s] += 1
        if not running:
            pending = [
                a for s in range(p) if nxt[s] < len(orders[s]) if (a := arrival(s)) is not None
            ]
            if not pending and all(nxt[s] == len(orders[s]) for s in range(p)):
                break
            if not pending:  # 1F1B never gets here; a guard against a broken order
                raise RuntimeError("pipeline schedule deadlocked")
            now = max(now, min(pending))
            continue
        soon = [a for a in waiting(running) if a > now]  # messages on their way
        rate = 1.0 / slow((len(running) + (len(soon) if receiving_computes else 0)) * copies)
        step = min(left for _, left in running.values()) / rate
        dt = min([step, *[a - now for a in soon]])
        now += dt
        done = []
        for s in list(running):
            running[s][1] -= dt * rate
            if running[s][1] <= 1e-15:
                done.append(running.pop(s)[0])
        for key in done:
            end[key], hops[key] = now, hop_of(len(running) * copies)
    busy = tuple(m * (forward_s[s] + backward_s[s]) for s in range(p))
    return PipelineTime(max(end.values()), busy)
