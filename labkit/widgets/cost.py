"""Explore the α-β cost model: network, world size, message size, algorithm → predicted time.

Introduced in notebooks/05_communication_cost.ipynb.

Every number is ``labkit.costmodel.predict`` (Thakur, Rabenseifner and Gropp 2005); the plot
is ``lk.viz.predicted_time_sweep``, with measured rows (e.g. from ``lk.bench.collective``)
drawn as points when the caller passes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.costmodel import ALGORITHMS, DEFAULT_ALGORITHM, PRESETS, Network, predict
from labkit.viz.cost_sweep import predicted_time_sweep
from labkit.widgets._base import Explorer

__all__ = ["CostExplorer", "cost_explorer"]


def _size_text(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


class CostExplorer(Explorer):
    """Predicted time of one collective, and its curve against size, from the α-β model.

    Args:
        network: a preset name of ``lk.costmodel.PRESETS`` or a ``Network`` (e.g. fitted
            with ``lk.costmodel.fit`` on this machine).
        world_size: number of ranks p.
        n_bytes: message size in bytes (nccl-tests' convention, as ``predict``).
        algorithm: an algorithm of ``collective`` (None: the default).
        collective: e.g. ``"all_reduce"``.
        measured: benchmark rows (``lk.bench.BenchResult`` or dicts) to draw as points.

    Raises:
        ValueError: as ``lk.costmodel.predict``, or an unknown preset.
    """

    def __init__(
        self,
        network: str | Network = "10GbE",
        world_size: int = 8,
        n_bytes: float = 1 << 20,
        algorithm: str | None = "ring",
        collective: str = "all_reduce",
        measured: Sequence[Any] = (),
    ) -> None:
        super().__init__()
        self.measured = list(measured)
        net = Network.preset(network) if isinstance(network, str) else network
        self.update(
            latency_us=net.latency_us,
            bandwidth_gbps=net.bandwidth_gbps,
            world_size=world_size,
            n_bytes=n_bytes,
            algorithm=algorithm,
            collective=collective,
            name=net.name,
        )

    def update(
        self,
        latency_us: float,
        bandwidth_gbps: float,
        world_size: int,
        n_bytes: float,
        algorithm: str | None,
        collective: str = "all_reduce",
        name: str = "",
    ) -> float:
        """Predict the time for these values, redraw; the widget's callback.

        Args:
            latency_us: α in µs.
            bandwidth_gbps: 1/β in GB/s.
            world_size: number of ranks.
            n_bytes: message size in bytes.
            algorithm: the algorithm (None: the collective's default).
            collective: the collective.
            name: the network's label.

        Returns:
            The predicted time in seconds (also ``predicted_s``).

        Raises:
            ValueError: as ``lk.costmodel.predict`` and ``Network``.
        """
        net = Network(latency_us, bandwidth_gbps, name=name)
        self.network, self.world_size, self.n_bytes = net, world_size, n_bytes
        self.predicted_s = predict(collective, n_bytes, world_size, net, algorithm)
        self.algorithm = algorithm or DEFAULT_ALGORITHM[collective]
        self.collective = collective
        algorithm = self.algorithm
        others = {
            a: predict(collective, n_bytes, world_size, net, a) for a in ALGORITHMS[collective]
        }
        self.predicted_all = others
        shown = [algorithm] if algorithm else []
        shown += [a for a in ALGORITHMS[collective] if a not in shown][: 3 - len(shown)]
        sizes = [8.0, float(1 << 30)] + [
            r["n_bytes"] if isinstance(r, dict) else r.n_bytes for r in self.measured
        ]
        self.figure = predicted_time_sweep(
            collective, world_size, net, shown, sizes, self.measured, mark_bytes=n_bytes
        )
        best = min(others, key=others.get)
        self.text = (
            f"{collective} of {_size_text(n_bytes)} on {world_size} ranks by "
            f"{algorithm}: {self.predicted_s * 1e6:,.1f} µs predicted"
            f"\nfastest by the model: {best} ({others[best] * 1e6:,.1f} µs)"
        )
        self._redraw()
        return self.predicted_s

    def _controls(self, widgets: Any) -> list[Any]:
        net = self.network
        preset = widgets.Dropdown(
            options=[*PRESETS, "custom"],
            value=net.name if net.name in PRESETS else "custom",
            description="network",
        )
        lat = widgets.FloatLogSlider(
            value=net.latency_us, base=10, min=-1, max=4, description="α (µs)"
        )
        bw = widgets.FloatLogSlider(
            value=net.bandwidth_gbps, base=10, min=-2, max=3, description="1/β (GB/s)"
        )
        ranks = widgets.IntSlider(value=self.world_size, min=1, max=1024, description="ranks")
        size = widgets.FloatLogSlider(
            value=self.n_bytes, base=2, min=0, max=32, step=1, description="bytes"
        )
        coll = widgets.Dropdown(options=list(ALGORITHMS), value=self.collective, description="op")
        algo = widgets.Dropdown(
            options=list(ALGORITHMS[self.collective]), value=self.algorithm, description="algorithm"
        )

        def from_preset(change: Any) -> None:
            if change["new"] in PRESETS:
                p = PRESETS[change["new"]]
                lat.value, bw.value = p.latency_us, p.bandwidth_gbps

        def from_collective(change: Any) -> None:
            algo.options = list(ALGORITHMS[change["new"]])
            algo.value = algo.options[0]

        def refresh(_change: Any = None) -> None:
            name = preset.value if preset.value in PRESETS else "custom"
            p = PRESETS.get(preset.value)
            if p is not None and (lat.value, bw.value) != (p.latency_us, p.bandwidth_gbps):
                name = "custom"
            if algo.value in ALGORITHMS[coll.value]:
                self.update(
                    lat.value, bw.value, ranks.value, size.value, algo.value, coll.value, name
                )

        preset.observe(from_preset, names="value")
        coll.observe(from_collective, names="value")
        for w in (lat, bw, ranks, size, algo):
            w.observe(refresh, names="value")
        return [widgets.HBox([preset, lat, bw]), widgets.HBox([coll, algo]), ranks, size]


def cost_explorer(
    network: str | Network = "10GbE",
    world_size: int = 8,
    n_bytes: float = 1 << 20,
    algorithm: str | None = "ring",
    collective: str = "all_reduce",
    measured: Sequence[Any] = (),
) -> Any:
    """An ipywidgets explorer of the α-β model's predicted time, with measured points.

    Thakur, Rabenseifner and Gropp 2005 (the formulas of ``lk.costmodel``).

    Args:
        network: a preset name or a ``Network``.
        world_size: number of ranks.
        n_bytes: message size in bytes.
        algorithm: the algorithm (None: the collective's default).
        collective: the collective.
        measured: rows from ``lk.bench`` to draw as points.

    Returns:
        The ipywidgets container; its ``explorer`` attribute is the ``CostExplorer``.

    Raises:
        ValueError: as ``CostExplorer``.
    """
    return CostExplorer(network, world_size, n_bytes, algorithm, collective, measured).widget()
