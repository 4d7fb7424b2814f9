"""A calibrated machine model: what one collective costs on this machine, term by term.

Introduced in notebooks/05_communication_cost.ipynb.

The α-β model fitted on a ping-pong describes two idle ranks passing one message. A collective
on a real backend pays more (notebook 05, section 5, measures each cause): a fixed cost per
call (Python, a worker thread, the ranks' arrival), the copies and reductions of its
implementation (``recipes``), bytes sent and received at once on links that are not full
duplex, one synchronisation per round, and, with more ranks than cores, CPUs shared between
ranks. A ``MachineModel`` holds each of these as a number measured on the machine
(``labkit.bench.calibrate`` measures them, ``labkit.costmodel.calibrate`` turns the
measurements into this model), and ``predict_collective`` adds them up::

    t = overhead(op, p) + (rounds − 1)·round_s(p) + messages·α·s(p)
        + wire·n·β·[duplex]·s(p) + copy·n·c(p, n) + reduce·n·a(p, n) + cross·n·h(p)

with the recipe's counts per byte of n (and its messages beyond the smallest call's: gloo's
ring cuts a buffer into more segments than p); c(p, n) and a(p, n) the seconds per byte of one
copy and of one ``a += b`` of n bytes while p ranks do the same at once (how ranks share the
cores and the memory, measured); s(p) = max(1, p/cores) / max(1, 2/cores), how many times as
many ranks take turns on a core as when α and β were measured on 2 ranks (a socket's bytes
are the kernel's work on the sending and the receiving core: on 4 ranks of 2 cores, in four
rounds of ``benchmarks/collective_model.py``'s launches with both priced on the same
measurements, gloo's rows came closer in 14 of 16 row-rounds with s(p) than with the copy
rates' ratio c(p, n)/c(2, n), which also counts the memory's contention at n); h(p) what a
byte costs beyond two private copies when one rank writes it into shared memory and another
copies it out (``labkit/bench_handoff.py``, measured in the backend's own launches: every line
comes from the other core's cache, and the host decides how far that is), paid on the bytes a
labkit_shm rank reads from its peers' slots (the recipe's ``cross``); and, between
bursts of compute as a training step makes the calls (``between_compute=True``), each call's
fixed cost measured that way (``sync_s``), and, where measured at a few sizes, what a call of
n bytes costs there beyond this formula's price of the same call back to back (``wake_s``: a
rank that blocks while its peers compute pays for being woken, in each step of the call that
waits; how much depends on the size).
``MachineModel.from_network`` builds the same object from a preset network
(and a device's FLOP/s) for what-if questions at cluster scale, where it reduces to the
textbook α-β-γ formulas (``predict``) with no per-call overhead and no sharing.

Pure arithmetic, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from labkit.costmodel.formulas import cost_terms
from labkit.costmodel.network import Network
from labkit.costmodel.predict import predict
from labkit.costmodel.recipes import KINDS, recipe

__all__ = ["P2P_BUSY", "BackendCosts", "MachineModel", "collective_terms", "predict_collective"]

NETWORK_KIND = "network"  # a backend priced by the α-β formulas alone (presets, what-if)
P2P_BUSY = "p2p_busy"  # a pipeline hop while every rank computes (``sync_s`` only)


@dataclass(frozen=True)
class BackendCosts:
    """One backend on one machine.

    Args:
        name: the backend's name (``"gloo"``, ``"labkit_shm"``, a preset's name).
        kind: which recipes price it: ``"gloo"``, ``"labkit_shm"`` or ``"network"`` (the
            α-β-γ formulas of ``formulas`` with each collective's default algorithm).
        alpha: one-way latency of a point-to-point message (s), from a ping-pong.
        beta: seconds per byte of a point-to-point message, from a ping-pong.
        duplex: an exchange of m bytes each way takes ``duplex`` × a one-way m (1: full
            duplex; 2: sending and receiving take turns).
        overhead_s: the time of a call too small to carry data, per ``(op, world_size)``:
            what every call pays whatever its size.
        round_s: per world size, the cost of one more round (labkit_shm's synchronisation).
        chunk_bytes: per world size, the bytes a round carries (labkit_shm's slot).
        sync_s: per ``(op, world_size)``, what one smallest call costs between bursts of
            compute, the way a training step makes it (``predict_collective(...,
            between_compute=True)`` uses it in place of ``overhead_s``).
        wake_s: per ``(op, world_size)``, ``{n_bytes: seconds}``: what a call of n bytes
            between bursts of compute costs beyond ``predict_collective``'s price of the same
            call back to back, measured at a few sizes (the smallest: ``sync_s`` less
            ``overhead_s``); between them piecewise linear in log n, constant beyond. Where
            present it prices ``between_compute`` calls: ``overhead_s`` + ``wake_s`` at the
            call's size. Keyed ``(op, group size, world_size)``: the same for a group smaller
            than the world while every group calls at once (pairs inside 4 ranks).
        cpu_s: per ``(op, group size, world_size)``, ``{n_bytes: seconds}``: the CPU time a
            rank's process spends in one call of a group smaller than the world, every group
            calling at once between bursts of compute (between the sizes as ``wake_s``).
        handoff_s: per world size, the seconds per byte a hand-off between two cores costs
            beyond two private copies (one rank writes the bytes into shared memory, another
            copies them out), measured in this backend's launches.
    """

    name: str
    kind: str
    alpha: float
    beta: float
    duplex: float = 1.0
    overhead_s: Mapping[tuple[str, int], float] = field(default_factory=dict)
    round_s: Mapping[int, float] = field(default_factory=dict)
    chunk_bytes: Mapping[int, int] = field(default_factory=dict)
    sync_s: Mapping[tuple[str, int], float] = field(default_factory=dict)
    wake_s: Mapping[tuple, Mapping[int, float]] = field(default_factory=dict)
    cpu_s: Mapping[tuple[str, int, int], Mapping[int, float]] = field(default_factory=dict)
    handoff_s: Mapping[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in (*KINDS, NETWORK_KIND):
            raise ValueError(f"kind must be one of {(*KINDS, NETWORK_KIND)}, got {self.kind!r}")
        if not (self.alpha >= 0 and self.beta >= 0 and self.duplex >= 1):
            raise ValueError(
                f"need alpha >= 0, beta >= 0, duplex >= 1; got {self.alpha}, {self.beta}, "
                f"{self.duplex}"
            )

    def cpu(self, op: str, group: int, world: int, n_bytes: float) -> float | None:
        """``cpu_s`` of a call of ``n_bytes`` on ``group`` ranks of ``world`` (None: not
        measured)."""
        table = self.cpu_s.get((op, group, world))
        return _interp(table, max(n_bytes, 1.0)) if table else None

    def handoff(self, world_size: int) -> float:
        """``handoff_s`` on ``world_size`` ranks, else at the nearest measured world size (0:
        none measured)."""
        if not self.handoff_s:
            return 0.0
        return self.handoff_s[min(self.handoff_s, key=lambda q: (abs(q - world_size), q))]

    @property
    def latency_us(self) -> float:
        """α in microseconds."""
        return self.alpha * 1e6

    @property
    def bandwidth_gbps(self) -> float:
        """1/β in GB/s (infinite for β = 0)."""
        return 1 / self.beta / 1e9 if self.beta > 0 else math.inf

    def overhead(
        self,
        op: str,
        world_size: int,
        between_compute: bool = False,
        n_bytes: float = 0.0,
        world: int | None = None,
    ) -> float:
        """The fixed cost of one call of ``n_bytes`` on ``world_size`` ranks (a group of a
        larger ``world``, if given): measured (between bursts of compute if asked and measured
        so, at its size where ``wake_s`` has it), else the α of each step of its formula."""
        key = (op, world_size) if world in (None, world_size) else (op, world_size, world)
        wake = (self.wake_s.get(key) or self.wake_s.get(key[:2])) if between_compute else None
        if wake:
            return self.overhead(op, world_size) + _interp(wake, max(n_bytes, 1.0))
        got = self.sync_s.get((op, world_size)) if between_compute else None
        got = got if got is not None else self.overhead_s.get((op, world_size))
        if got is not None:
            return got
        if op == P2P_BUSY:  # not measured: a hop like any other
            return self.overhead("p2p", world_size, between_compute)
        if op == "p2p":
            return self.alpha
        return _steps(op, world_size) * self.alpha


def _steps(op: str, p: int) -> float:
    return cost_terms(op, p).steps if p > 1 else 0.0


@dataclass(frozen=True)
class MachineModel:
    """The machine: its cores, its memory rates while p ranks work at once, and its backends.

    Args:
        cores: CPU cores the ranks run on.
        copy_s_per_byte: per world size p, per buffer size n in bytes, the seconds per byte
            of a single-thread copy of n bytes while all p ranks copy at once (p = 1: one
            rank alone). The ratio between two world sizes is how the ranks share the cores
            and the memory.
        add_s_per_byte: the same for one reduction pass ``a += b`` over n bytes.
        compute_share: per world size p, how much slower compute-bound work (a small matrix
            product) runs while p ranks do it at once than on one rank alone.
        backends: the backends by name.
        gamma: γ for the ``"network"`` backends of ``from_network`` (s/byte).
        flops: sustained FLOP/s of one device, for what-if questions (None: unknown).
        name: a label.
    """

    cores: int
    copy_s_per_byte: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    add_s_per_byte: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    compute_share: Mapping[int, float] = field(default_factory=dict)
    backends: Mapping[str, BackendCosts] = field(default_factory=dict)
    gamma: float = 0.0
    flops: float | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if self.cores < 1 or self.gamma < 0:
            raise ValueError(f"need cores >= 1 and gamma >= 0, got {self.cores}, {self.gamma}")

    def copy_rate(self, world_size: int, n_bytes: float) -> float:
        """Seconds per byte of a copy of ``n_bytes`` while ``world_size`` ranks copy."""
        return _lookup(self.copy_s_per_byte, world_size, n_bytes, self.cores)

    def add_rate(self, world_size: int, n_bytes: float) -> float:
        """Seconds per byte of ``a += b`` over ``n_bytes`` while ``world_size`` ranks do it."""
        return _lookup(self.add_s_per_byte, world_size, n_bytes, self.cores)

    def turns(self, world_size: int, base: int = 1) -> float:
        """How many times as many ranks share each core with ``world_size`` ranks as with
        ``base``: max(1, p/cores) / max(1, base/cores)."""
        return max(1.0, world_size / self.cores) / max(1.0, base / self.cores)

    def compute_share_at(self, world_size: int) -> float:
        """The compute sharing factor for ``world_size`` ranks: measured, else max(1, p/cores)."""
        got = self.compute_share.get(world_size)
        return got if got is not None else max(1.0, world_size / self.cores)

    def backend(self, name: str) -> BackendCosts:
        """The backend called ``name``.

        Raises:
            KeyError: a backend this model was not calibrated for (the message lists them).
        """
        if name not in self.backends:
            raise KeyError(f"no backend {name!r} in this model; it has {sorted(self.backends)}")
        return self.backends[name]

    @classmethod
    def from_network(
        cls, network: Network, flops: float | None = None, name: str = ""
    ) -> MachineModel:
        """The model of a described network: the α-β-γ formulas, no overhead, no sharing.

        What the course uses where it cannot measure (a cluster's InfiniBand, NVLink): the
        same ``predict_collective`` then gives ``lk.costmodel.predict``'s times.

        Args:
            network: the ``lk.Network`` (e.g. ``lk.Network.preset("100Gb-IB")``).
            flops: sustained FLOP/s of one device (e.g. a GPU's), for step times.
            name: a label (default: the network's).

        Returns:
            A ``MachineModel`` with one backend, named after the network.
        """
        label = name or network.name or "network"
        costs = BackendCosts(label, NETWORK_KIND, network.alpha, network.beta)
        return cls(1, backends={label: costs}, gamma=network.gamma, flops=flops, name=label)


def _interp(table: Mapping[int, float], n: float) -> float:
    """Piecewise linear in log2(n) between the measured sizes, constant beyond them."""
    sizes = sorted(table)
    if n <= sizes[0]:
        return table[sizes[0]]
    if n >= sizes[-1]:
        return table[sizes[-1]]
    for a, b in zip(sizes, sizes[1:], strict=False):
        if a <= n <= b:
            w = (math.log2(n) - math.log2(a)) / (math.log2(b) - math.log2(a))
            return table[a] + w * (table[b] - table[a])
    return table[sizes[-1]]  # not reached


def _lookup(rates: Mapping[int, Mapping[int, float]], p: int, n: float, cores: int) -> float:
    """The rate for p ranks at size n; an unmeasured p scales the nearest measured one by
    max(1, p/cores) over its own."""
    if not rates:
        return 0.0
    if p in rates and rates[p]:
        return _interp(rates[p], n)
    q = min(rates, key=lambda k: abs(k - p))
    return _interp(rates[q], n) * max(1.0, p / cores) / max(1.0, q / cores)


def collective_terms(
    machine: MachineModel,
    backend: str,
    op: str,
    n_bytes: float,
    world_size: int,
    between_compute: bool = False,
    world: int | None = None,
) -> dict[str, float]:
    """Each term of ``predict_collective``'s time, in seconds.

    Args:
        machine: the calibrated ``MachineModel``.
        backend: a backend name of ``machine``.
        op: ``"all_reduce"``, ``"all_gather"``, ``"reduce_scatter"``, ``"broadcast"`` or
            ``"p2p"`` (one message, α + nβ, or its cost measured while ``world_size`` ranks
            pass messages in pairs), or ``"p2p_busy"`` (the same, measured while every rank
            computes and passes one on: a pipeline's steady state).
        n_bytes: the size, nccl-tests' convention (all_gather: the gathered output;
            reduce_scatter: each rank's input).
        world_size: ranks p.
        between_compute: the call comes between bursts of compute, as in a training step
            (its fixed cost is then ``sync_s``, or ``wake_s`` at its size, where measured).
        world: the ranks busy meanwhile, when the call is a group's inside a larger world
            (``wake_s`` measured so, where it was).

    Returns:
        ``{"overhead", "rounds", "wire", "copy", "reduce", "handoff"}`` (zeros on one rank); for a
        ``"network"`` backend ``{"formula": ...}`` alone.

    Raises:
        KeyError: an unknown backend. ValueError: an unknown op, a size < 0.
    """
    if not n_bytes >= 0:
        raise ValueError(f"n_bytes must be >= 0, got {n_bytes!r}")
    b, p, n = machine.backend(backend), world_size, float(n_bytes)
    if op in ("p2p", P2P_BUSY):  # one message; world_size: how many ranks are busy meanwhile
        return {"overhead": b.overhead(op, max(p, 2), between_compute, n), "wire": n * b.beta}
    if p <= 1:
        return dict.fromkeys(("overhead", "rounds", "wire", "copy", "reduce", "handoff"), 0.0)
    if b.kind == NETWORK_KIND:
        net = Network.from_alpha_beta(b.alpha, max(b.beta, 1e-300), machine.gamma)
        return {"formula": predict(op, n, p, net)}
    r = recipe(b.kind, op, p, n)
    chunk = b.chunk_bytes.get(p, 0)
    # the smallest call's rounds (its own recipe's: one-shot) are in its measured overhead
    extra = r.rounds(n, chunk) - recipe(b.kind, op, p, 0).rounds(0, chunk)
    # α and β were measured with 2 ranks busy; a socket's bytes are the kernel's work on the
    # sending and the receiving core, so beyond 2 ranks they slow as more ranks share a core
    wire_share = machine.turns(p, base=2)
    return {
        "overhead": b.overhead(op, p, between_compute, n, world),
        "rounds": extra * b.round_s.get(p, 0.0) + wire_share * r.messages * b.alpha,
        "wire": wire_share * r.wire * n * b.beta * (b.duplex if r.exchange else 1.0),
        "copy": r.copy * n * machine.copy_rate(p, n),
        "reduce": r.reduce * n * machine.add_rate(p, n),
        "handoff": r.cross * n * b.handoff(p),
    }


def predict_collective(
    machine: MachineModel,
    backend: str,
    op: str,
    n_bytes: float,
    world_size: int,
    between_compute: bool = False,
    world: int | None = None,
) -> float:
    """Predicted seconds of one ``op`` of ``n_bytes`` on ``world_size`` ranks of ``backend``.

    The sum of ``collective_terms`` (this module's docstring has the formula).

    Args:
        machine: the calibrated ``MachineModel``.
        backend: a backend name of ``machine``.
        op: as ``collective_terms``.
        n_bytes: as ``collective_terms``.
        world_size: ranks p.
        between_compute, world: as ``collective_terms``.

    Returns:
        Seconds (0 on one rank).

    Raises:
        KeyError, ValueError: as ``collective_terms``.
    """
    terms = collective_terms(machine, backend, op, n_bytes, world_size, between_compute, world)
    return math.fsum(terms.values())
