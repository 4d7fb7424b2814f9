"""A network in the α-β(-γ) model: latency α, time per byte β, reduction time per byte γ.

Introduced in notebooks/05_communication_cost.ipynb.

Hockney's model of one message of n bytes, ``t(n) = α + n·β`` (Hockney, "The communication
challenge for MPP: Intel Paragon and Meiko CS-2", Parallel Computing 20(3), 1994), with the
reduction cost γ per byte that Thakur, Rabenseifner and Gropp add for reducing collectives
("Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005, §2).

A ``Network`` is described the way hardware is sold — a latency in µs and a bandwidth in GB/s
(10⁹ bytes per second, as nccl-tests and ``lk.bench`` count; not Gbit/s) — and exposes the
model's ``alpha`` (s) and ``beta`` (s/byte). ``fit`` finds them from point-to-point times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["PRESETS", "Network", "fit", "least_squares_alpha_beta"]

GB = 1e9  # bytes per GB


@dataclass(frozen=True)
class Network:
    """An α-β(-γ) network: ``latency_us`` (α in µs) and ``bandwidth_gbps`` (1/β in GB/s).

    Args:
        latency_us: start-up time of one message, α, in microseconds (≥ 0).
        bandwidth_gbps: asymptotic bandwidth 1/β in GB/s = 10⁹ bytes/s (> 0; ``inf`` allowed).
        gamma_s_per_byte: time to reduce (e.g. add) one byte, γ, in seconds (≥ 0).
        name: a label for tables and plots.

    Raises:
        ValueError: a negative latency or γ, or a bandwidth that is not positive.
    """

    latency_us: float
    bandwidth_gbps: float
    gamma_s_per_byte: float = 0.0
    name: str = ""

    def __post_init__(self) -> None:
        if not (self.latency_us >= 0 and math.isfinite(self.latency_us)):
            raise ValueError(f"latency_us must be a finite number >= 0, got {self.latency_us!r}")
        if not self.bandwidth_gbps > 0:
            raise ValueError(f"bandwidth_gbps must be > 0 (GB/s), got {self.bandwidth_gbps!r}")
        if not (self.gamma_s_per_byte >= 0 and math.isfinite(self.gamma_s_per_byte)):
            raise ValueError(f"gamma_s_per_byte must be >= 0, got {self.gamma_s_per_byte!r}")

    @property
    def alpha(self) -> float:
        """α: the latency of one message, in seconds."""
        return self.latency_us * 1e-6

    @property
    def beta(self) -> float:
        """β: the time per byte, in seconds per byte (1 / bandwidth)."""
        return 1.0 / (self.bandwidth_gbps * GB)

    @property
    def gamma(self) -> float:
        """γ: the time to reduce one byte, in seconds per byte."""
        return self.gamma_s_per_byte

    @property
    def n_half_bytes(self) -> float:
        """Hockney's n½ = α/β: the message size that reaches half the bandwidth."""
        return self.alpha / self.beta

    def p2p_time_s(self, n_bytes: float) -> float:
        """Time of one ``n_bytes`` message, α + n·β, in seconds."""
        return self.alpha + n_bytes * self.beta

    def label(self) -> str:
        """``name (α = … µs, 1/β = … GB/s)`` for legends and tables."""
        head = f"{self.name} " if self.name else ""
        return f"{head}(α = {self.latency_us:.3g} µs, 1/β = {self.bandwidth_gbps:.3g} GB/s)"

    @classmethod
    def from_alpha_beta(
        cls, alpha: float, beta: float, gamma: float = 0.0, name: str = ""
    ) -> Network:
        """The network with ``alpha`` (s) and ``beta`` (s/byte), e.g. from ``lk.bench``'s fit.

        Args:
            alpha: latency in seconds.
            beta: time per byte in seconds (> 0).
            gamma: reduction time per byte in seconds.
            name: label.

        Returns:
            The ``Network``.

        Raises:
            ValueError: as the constructor (``beta <= 0``, ``alpha < 0``).
        """
        if not beta > 0:
            raise ValueError(f"beta must be > 0 s/byte, got {beta!r}")
        return cls(alpha * 1e6, 1.0 / beta / GB, gamma, name)

    @classmethod
    def preset(cls, name: str) -> Network:
        """A typical network by name: ``"loopback"``, ``"10GbE"``, ``"100Gb-IB"``, ``"NVLink"``.

        The numbers and their sources are in ``PRESETS``; they are orders of magnitude for
        what-if questions, not a substitute for measuring (``fit``).

        Args:
            name: a key of ``PRESETS`` (case-insensitive).

        Returns:
            The preset ``Network``.

        Raises:
            ValueError: an unknown name (the message lists the known ones).
        """
        for key, net in PRESETS.items():
            if key.lower() == str(name).lower():
                return net
        raise ValueError(f"unknown network preset {name!r}; known: {', '.join(PRESETS)}")


# Typical numbers (orders of magnitude; measure your own with ``fit``):
# - loopback: TCP over Linux loopback on one modern host moves tens of Gbit/s (iperf3) with a
#   one-way latency around 10 µs. Sandboxed machines (like the course's) are far slower: the
#   notebook fits their own α and β.
# - 10GbE: IEEE 802.3ae line rate 10 Gbit/s = 1.25 GB/s; MPI over kernel TCP on 10 GbE
#   reports one-way latencies of a few tens of µs (e.g. OSU osu_latency, small messages).
# - 100Gb-IB: EDR InfiniBand, 100 Gbit/s = 12.5 GB/s per direction; MPI one-way latency
#   around 1 µs with RDMA (Mellanox ConnectX-4 EDR data; OSU osu_latency).
# - NVLink: NVLink 3 on an A100 (NVIDIA A100 datasheet: 600 GB/s bidirectional, i.e. 300 GB/s
#   each way per GPU); a few µs per step for NCCL inside a node.
PRESETS: dict[str, Network] = {
    "loopback": Network(latency_us=10.0, bandwidth_gbps=5.0, name="loopback"),
    "10GbE": Network(latency_us=20.0, bandwidth_gbps=1.25, name="10GbE"),
    "100Gb-IB": Network(latency_us=1.0, bandwidth_gbps=12.5, name="100Gb-IB"),
    "NVLink": Network(latency_us=3.0, bandwidth_gbps=300.0, name="NVLink"),
}


def least_squares_alpha_beta(
    ns: Sequence[float], ts: Sequence[float], relative: bool = True
) -> tuple[float, float]:
    """The weighted least-squares line ``t = α + n·β`` through the points (unconstrained).

    The normal equations in closed form. With ``relative`` each point weighs 1/t², so its
    residual counts relative to its time; otherwise every point weighs 1.

    Args:
        ns: message sizes in bytes (at least two distinct; the caller checks).
        ts: the time of each, in seconds (> 0 with ``relative``; the caller checks).
        relative: minimise relative rather than absolute residuals.

    Returns:
        ``(alpha, beta)``: seconds, and seconds per byte; α may come out negative.
    """
    ws = [1.0 / t**2 if relative else 1.0 for t in ts]
    sw = sum(ws)
    mn = sum(w * n for w, n in zip(ws, ns, strict=True)) / sw
    mt = sum(w * t for w, t in zip(ws, ts, strict=True)) / sw
    snn = sum(w * (n - mn) ** 2 for w, n in zip(ws, ns, strict=True))
    snt = sum(w * (n - mn) * (t - mt) for w, n, t in zip(ws, ns, ts, strict=True))
    beta = snt / snn
    return mt - beta * mn, beta


def fit(
    sizes_bytes: Sequence[float],
    times_s: Sequence[float],
    relative: bool = True,
    name: str = "fit",
) -> Network:
    """Fit Hockney's ``t = α + n·β`` to point-to-point times by least squares.

    Hockney 1994 (the α-β model). With ``relative=True`` each residual is divided by its
    measured time, so a 1-byte message (which sets α) weighs as much as a 16 MB one (which
    sets β); ``relative=False`` is ordinary least squares. The fit is constrained to α ≥ 0:
    when the unconstrained optimum has α < 0 (noisy small-message times), the best line
    through the origin is returned instead, which is the constrained least-squares solution.
    On exact data ``t = α + nβ`` both recover α and β exactly.

    Args:
        sizes_bytes: message sizes (at least two distinct).
        times_s: one-way time of each message, in seconds (> 0).
        relative: minimise relative rather than absolute residuals.
        name: the fitted network's label.

    Returns:
        A ``Network`` with the fitted ``alpha`` and ``beta`` (γ = 0).

    Raises:
        ValueError: mismatched lengths, fewer than two distinct sizes, a time ≤ 0, or times
            that do not grow with size (β ≤ 0: no bandwidth to fit).
    """
    ns = [float(n) for n in sizes_bytes]
    ts = [float(t) for t in times_s]
    if len(ns) != len(ts):
        raise ValueError(f"got {len(ns)} sizes but {len(ts)} times")
    if len(set(ns)) < 2:
        raise ValueError("fit needs times for at least two different sizes")
    if any(not (t > 0 and math.isfinite(t)) for t in ts):
        raise ValueError("fit needs positive, finite times")
    alpha, beta = least_squares_alpha_beta(ns, ts, relative)
    if alpha < 0:  # constrained optimum: the line through the origin
        ws = [1.0 / t**2 if relative else 1.0 for t in ts]
        beta = sum(w * n * t for w, n, t in zip(ws, ns, ts, strict=True)) / sum(
            w * n * n for w, n in zip(ws, ns, strict=True)
        )
        alpha = 0.0
    if not beta > 0:
        raise ValueError(
            f"the times do not grow with the size (fitted beta = {beta:.3g} s/byte): measure "
            "larger messages, or take the minimum over more iterations"
        )
    return Network.from_alpha_beta(alpha, beta, name=name)
