"""From microbenchmark samples to a ``MachineModel``: one statistic and one formula per term.

Introduced in notebooks/05_communication_cost.ipynb.

``labkit.bench.calibrate`` runs the microbenchmarks (a ping-pong and an exchange per backend,
each collective at its smallest size, a memcpy, a reduction pass, and p ranks copying or
computing at once against one alone) and hands their raw samples to ``machine_from_probes``,
which is pure arithmetic — so a test can feed it made-up samples and check that it recovers
the numbers they were made from:

- α, β: ``lk.costmodel.fit`` (relative least squares, α ≥ 0) on the fastest ping-pong times
  (medians of a ping-pong carry whole time slices of other processes: notebook 01);
- duplex: exchange time / one-way time for the same bytes (at least 1);
- overhead(op, p): the time of the op at its smallest size, called back to back;
- sync_s(op, p): what the same call adds between short bursts of compute, as a training step
  makes it (the time per burst with the call, less the time per burst without it);
- wake_s(op, p, n): what a call of n bytes between bursts costs (per burst with the call, less
  per burst without it) beyond the model's price of the same call back to back, at a few
  sizes — on the least-squares line a + b·n through them (a, b ≥ 0: a peer woken, and a part
  per byte; in eight 2-rank calibrations in a row on 2 cores, each size alone had a standard
  deviation of 0.17–0.80 ms, the line 0.19–0.64 ms) — with sync_s − overhead as its smallest
  size's; wake_s(op, 2, n, world) the same for pairs calling at once inside a larger world (tp
  or dp groups of 2 in a 2-D run);
- cpu_s(op, 2, world, n): what one such call of a pair costs its rank's CPU (the process's CPU
  time, every thread's, per burst with the call less per burst without it), on the least-squares
  line through the sizes: with more ranks than cores, what a call inside forward or backward
  takes from the cores while the other pairs compute through its waits;
- round_s(p): the time of a barrier (one round) on p ranks, for backends that work in rounds;
- handoff_s(p): per byte, one hand-off's round (a rank writes n bytes into shared memory,
  another copies them out, the first sees it done) less two copies of n between private
  buffers (at least 0), in the backend's own launches on p ranks;
- copy and reduction rates: seconds per byte of one copy and of one ``a += b`` of n bytes,
  per size, while p ranks do the same at once (p = 1: one rank alone), which is how the ranks
  share the cores and the memory;
- compute_share(p): the time of a fixed amount of compute while p ranks do it at once over
  the fastest run of the same work by one rank alone (compute calibrated on its fastest runs,
  ``lk.bench.workload_from_model``, times this factor is compute as p ranks see it now).

Each term takes one statistic of its samples: ``"min"`` (the machine at its best, which other
processes' load cannot inflate: what notebook 05 compares with the fastest sample of each
collective) or ``"median"`` (a typical call: what a training step pays).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from labkit.costmodel.machine import P2P_BUSY, BackendCosts, MachineModel, predict_collective
from labkit.costmodel.network import fit

HOPS = ("p2p", P2P_BUSY)  # a pipeline's hop: its smallest message is one float

__all__ = [
    "HOPS",
    "STATS",
    "BackendProbes",
    "Probes",
    "machine_from_probes",
    "pick",
    "pool",
    "pool_pairs",
    "pool_rows",
]

STATS = ("min", "median")
Samples = Sequence[float]


def pick(samples: Samples, stat: str) -> float:
    """One number from samples: their minimum or their median.

    Raises:
        ValueError: no samples or an unknown statistic.
    """
    if stat not in STATS:
        raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
    if not samples:
        raise ValueError("no samples")
    return min(samples) if stat == "min" else statistics.median(samples)


@dataclass
class BackendProbes:
    """Raw samples of one backend (seconds).

    Attributes:
        name: the backend's name; kind: its recipes (``"gloo"``, ``"labkit_shm"``).
        p2p: ``(bytes, one-way samples)`` per ping-pong size, on 2 ranks.
        exchange: ``(bytes, exchange samples, one-way samples)``: every rank sends and
            receives the bytes at once, against one direction only.
        tiny: ``(op, world_size) → samples`` of each op at its smallest size, and of
            ``"barrier"``.
        between: ``(op, world_size) → (samples with the op, samples without)``: the time per
            burst of compute with the op at its smallest size after each burst, and without.
        chunk_bytes: per world size, the bytes one round carries (0: no rounds).
        sized: ``(op, group size, n_bytes, world_size) → (samples with the op, samples
            without)``: per burst of compute with a call of n bytes after it, and per burst
            alone (a group smaller than the world: every group calls at once).
        sized_cpu: the same for a group smaller than the world, in CPU seconds of a rank's
            process (every thread), the mean over ranks.
        handoff: ``(world_size, n_bytes) → (round samples, private copy samples)`` of
            ``labkit.bench_handoff.handoff``.
    """

    name: str
    kind: str
    p2p: list[tuple[int, Samples]] = field(default_factory=list)
    exchange: list[tuple[int, Samples, Samples]] = field(default_factory=list)
    tiny: dict[tuple[str, int], Samples] = field(default_factory=dict)
    chunk_bytes: dict[int, int] = field(default_factory=dict)
    between: dict[tuple[str, int], tuple[Samples, Samples]] = field(default_factory=dict)
    sized: dict[tuple[str, int, int, int], tuple[Samples, Samples]] = field(default_factory=dict)
    sized_cpu: dict[tuple[str, int, int, int], tuple[Samples, Samples]] = field(
        default_factory=dict
    )
    handoff: dict[tuple[int, int], tuple[Samples, Samples]] = field(default_factory=dict)


@dataclass
class Probes:
    """Raw samples of the machine and its backends (seconds).

    Attributes:
        cores: CPU cores available to the ranks.
        copy: ``p → [(bytes, samples), ...]``: one single-thread copy of that many bytes
            while p ranks copy at once (the slowest rank's time; p = 1: one rank alone).
        add: the same for one ``a += b`` over that many bytes.
        compute_share: ``p → (samples alone, samples with p ranks at once)`` of a fixed
            amount of compute.
        backends: one ``BackendProbes`` per backend.
    """

    cores: int
    copy: dict[int, list[tuple[int, Samples]]] = field(default_factory=dict)
    add: dict[int, list[tuple[int, Samples]]] = field(default_factory=dict)
    compute_share: dict[int, tuple[Samples, Samples]] = field(default_factory=dict)
    backends: list[BackendProbes] = field(default_factory=list)


def pool_rows(rows: list, more: list) -> list:
    """``(size, samples)`` rows with the samples of ``more`` added size by size."""
    have = {n: list(s) for n, s in rows}
    for n, s in more:
        have[n] = [*have.get(n, []), *s]
    return sorted(have.items())


def pool_pairs(into: dict, more: Mapping) -> None:
    """``key → (samples, samples)`` of ``more`` added to ``into``'s, key by key (in place)."""
    for key, (a, b) in more.items():
        old = into.get(key, ([], []))
        into[key] = ([*old[0], *a], [*old[1], *b])


def pool(*many: Probes) -> Probes:
    """The samples of several calibrations of one machine, term by term, as one.

    A machine whose load drifts over minutes lands each calibration somewhere else: a model
    made of calibrations taken before and after what it predicts (its medians over both)
    follows that drift where one calibration alone may land away from it.

    Raises:
        ValueError: nothing to pool.
    """
    if not many:
        raise ValueError("pool needs at least one Probes")
    out = Probes(cores=min(p.cores for p in many))
    for probes in many:
        for name in ("copy", "add"):
            table = getattr(out, name)
            for q, rows in getattr(probes, name).items():
                table[q] = pool_rows(table.get(q, []), rows)
        pool_pairs(out.compute_share, probes.compute_share)
        for b in probes.backends:
            mine = next((x for x in out.backends if x.name == b.name), None)
            if mine is None:
                mine = BackendProbes(b.name, b.kind)
                out.backends.append(mine)
            mine.p2p = pool_rows(mine.p2p, b.p2p)
            exchange = {n: (both, one) for n, both, one in mine.exchange}
            pool_pairs(exchange, {n: (both, one) for n, both, one in b.exchange})
            mine.exchange = [(n, *v) for n, v in sorted(exchange.items())]
            for key, samples in b.tiny.items():
                mine.tiny[key] = [*mine.tiny.get(key, []), *samples]
            pool_pairs(mine.between, b.between)
            pool_pairs(mine.sized, b.sized)
            pool_pairs(mine.sized_cpu, b.sized_cpu)
            pool_pairs(mine.handoff, b.handoff)
            mine.chunk_bytes.update(b.chunk_bytes)
    return out


def _ratio(pairs: Mapping[int, tuple[Samples, Samples]], stat: str) -> dict[int, float]:
    # over the fastest run alone: how much slower the work goes now, other processes included
    return {p: max(1.0, pick(both, stat) / min(alone)) for p, (alone, both) in pairs.items()}


def _rates(table: Mapping[int, list[tuple[int, Samples]]], stat: str) -> dict:
    return {p: {n: pick(s, stat) / n for n, s in rows} for p, rows in table.items()}


def _backend(probe: BackendProbes, stat: str) -> BackendCosts:
    alpha, beta = 0.0, 0.0
    if probe.p2p:  # the line through the fastest samples, whatever ``stat`` (notebook 01)
        sizes, times = [n for n, _ in probe.p2p], [min(s) for _, s in probe.p2p]
        try:
            net = fit(sizes, times)
            alpha, beta = net.alpha, net.beta
        except ValueError:  # a load spike hid the growth: α of the smallest, β of the largest
            alpha = times[sizes.index(min(sizes))]
            beta = times[sizes.index(max(sizes))] / max(sizes)
    duplex = 1.0
    if probe.exchange:
        n, both, one = max(probe.exchange, key=lambda e: e[0])
        duplex = max(1.0, pick(both, stat) / pick(one, stat))
    overhead = {key: pick(s, stat) for key, s in probe.tiny.items() if key[0] != "barrier"}
    rounds = {}
    if any(probe.chunk_bytes.values()):
        rounds = {p: pick(s, stat) for (op, p), s in probe.tiny.items() if op == "barrier"}
    sync = {
        key: max(0.0, pick(with_op, stat) - pick(without, stat))
        for key, (with_op, without) in probe.between.items()
    }
    return BackendCosts(
        probe.name,
        probe.kind,
        alpha,
        beta,
        duplex,
        overhead_s=overhead,
        round_s=rounds,
        chunk_bytes=dict(probe.chunk_bytes),
        sync_s=sync,
        cpu_s=_cpu(probe, stat),
        handoff_s={
            p: max(0.0, pick(round_, stat) - 2 * pick(private, stat)) / n
            for (p, n), (round_, private) in sorted(probe.handoff.items())
        },
    )


def _cpu(probe: BackendProbes, stat: str) -> dict:
    """``cpu_s``: per ``(op, group, world)``, the CPU seconds a rank spends in one call of a
    group inside a larger world, on the line through the sizes measured."""
    cpu: dict = {}
    for (op, q, n, p), (with_op, without) in probe.sized_cpu.items():
        cpu.setdefault((op, q, p), {})[n] = max(0.0, pick(with_op, stat) - pick(without, stat))
    return {key: _line(table) for key, table in cpu.items()}


def _line(table: dict[int, float]) -> dict[int, float]:
    """The least-squares line a + b·n through ``n → seconds`` (a, b ≥ 0), at the same n."""
    ns, ts = list(table), list(table.values())
    k = len(ns)
    mean_n, mean_t = sum(ns) / k, sum(ts) / k
    var = sum((n - mean_n) ** 2 for n in ns)
    b = sum((n - mean_n) * (t - mean_t) for n, t in zip(ns, ts, strict=True)) / var if var else 0
    a = mean_t - b * mean_n
    if b < 0:
        a, b = mean_t, 0.0
    if a < 0:  # through the origin
        a, b = 0.0, sum(n * t for n, t in zip(ns, ts, strict=True)) / sum(n * n for n in ns)
    return {n: a + b * n for n in ns}


def _wake(machine: MachineModel, probe: BackendProbes, stat: str) -> dict:
    """``wake_s`` of one backend: each sized call between bursts less the model's price of
    the same call back to back (``machine`` has every other term already), on the line
    through the sizes measured: a fixed part (a peer woken) and a part per byte."""
    costs, wake = machine.backend(probe.name), {}
    for (op, q, n, p), (with_op, without) in probe.sized.items():
        back_to_back = predict_collective(machine, probe.name, op, n, q)
        extra = pick(with_op, stat) - pick(without, stat) - back_to_back
        wake.setdefault((op, q) if q == p else (op, q, p), {})[n] = max(0.0, extra)
    wake = {key: _line(table) for key, table in wake.items()}
    for key, table in wake.items():  # the smallest call on the whole world: a float per rank
        if key in costs.sync_s:
            tiny = 4 if key[0] in HOPS else 4 * key[1]
            table[tiny] = max(0.0, costs.sync_s[key] - costs.overhead(*key))
    return wake


def machine_from_probes(probes: Probes, stat: str = "min", name: str = "") -> MachineModel:
    """The ``MachineModel`` the samples describe, each term by this module's docstring.

    Args:
        probes: the raw samples (``labkit.bench.calibrate`` measures them).
        stat: ``"min"`` or ``"median"`` of each term's samples.
        name: a label.

    Returns:
        The ``MachineModel``.

    Raises:
        ValueError: an unknown statistic, empty samples, or ping-pong times that do not grow
            with the size.
    """
    machine = MachineModel(
        cores=probes.cores,
        copy_s_per_byte=_rates(probes.copy, stat),
        add_s_per_byte=_rates(probes.add, stat),
        compute_share=_ratio(probes.compute_share, stat),
        backends={b.name: _backend(b, stat) for b in probes.backends},
        name=name,
    )
    backends = {
        b.name: dataclasses.replace(machine.backend(b.name), wake_s=_wake(machine, b, stat))
        for b in probes.backends
    }
    return dataclasses.replace(machine, backends=backends)
