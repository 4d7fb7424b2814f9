"""Explore parallelism plans: a model, devices and a network → every plan, best first.

Introduced in notebooks/18_hybrid_parallel.ipynb.

The plans are ``labkit.planner.plan``'s (memory from ``labkit.memory``, times from
``labkit.costmodel``); ``lk.viz.plan_breakdown`` draws them and the text lists the best plans
with the reasoning of the first one.
"""

from __future__ import annotations

from typing import Any

from labkit.costmodel import PRESETS, Network
from labkit.planner import DeviceSpec, ModelSpec, Plan, plan
from labkit.viz.mesh import plan_breakdown
from labkit.widgets._base import Explorer

__all__ = ["PlannerExplorer", "planner_explorer"]


class PlannerExplorer(Explorer):
    """The planner's table and bars for one model, device count and network.

    Args:
        model: the ``ModelSpec`` (default: a 7B GPT-like model, 32 layers, h = 4096).
        devices: the ``DeviceSpec`` (default: 8 devices of 80 GB at 300 TFLOP/s sustained).
        network: a preset name of ``lk.costmodel.PRESETS`` or an ``lk.Network``.
        mixed_precision: as ``plan``.
        top: plans listed and drawn.

    Raises:
        PlanError: as ``plan``.
        ValueError: an unknown network preset.
    """

    def __init__(
        self,
        model: ModelSpec | None = None,
        devices: DeviceSpec | None = None,
        network: str | Network = "NVLink",
        mixed_precision: bool = True,
        top: int = 8,
    ) -> None:
        super().__init__()
        self.model = model or ModelSpec(
            n_params=7 * 10**9, n_layers=32, hidden=4096, seq_len=2048, batch=64, n_heads=32
        )
        self.devices = devices or DeviceSpec(count=8, memory_bytes=80e9, flops=300e12)
        self.top = top
        self.update(
            n_params=self.model.n_params,
            count=self.devices.count,
            memory_gb=self.devices.memory_bytes / 1e9,
            network=network,
            mixed_precision=mixed_precision,
        )

    def update(
        self,
        n_params: int,
        count: int,
        memory_gb: float,
        network: str | Network,
        mixed_precision: bool = True,
        batch: int | None = None,
    ) -> list[Plan]:
        """Plan again with these values and redraw; the widget's callback.

        Args:
            n_params: Ψ (the other model sizes stay those of ``model``).
            count: devices.
            memory_gb: memory per device in GB (10⁹ bytes).
            network: a preset name or an ``lk.Network``.
            mixed_precision: as ``plan``.
            batch: the global batch (None: keep ``model``'s).

        Returns:
            Every plan, best first (also ``plans``; ``best`` is the first feasible or None).

        Raises:
            PlanError: as ``plan``.
            ValueError: an unknown network preset.
        """
        net = Network.preset(network) if isinstance(network, str) else network
        m = self.model
        self.model = ModelSpec(
            int(n_params), m.n_layers, m.hidden, m.seq_len, batch or m.batch, m.n_heads,
            m.bytes_per_param, m.name,
        )  # fmt: skip
        d = self.devices
        self.devices = DeviceSpec(int(count), memory_gb * 1e9, d.flops, d.per_node)
        self.network, self.mixed_precision = net, mixed_precision
        self.plans = plan(self.model, self.devices, net, mixed_precision=mixed_precision)
        self.best = self.plans[0] if self.plans[0].feasible else None
        n_ok = sum(p.feasible for p in self.plans)
        lines = [
            f"Ψ = {n_params / 1e9:g}B on {count} × {memory_gb:g} GB over {net.label()}: "
            f"{n_ok} of {len(self.plans)} plans fit"
        ]
        for p in self.plans[: self.top]:
            mark = "ok " if p.feasible else "✗  "
            lines.append(
                f"{mark}{p.label:<26} {p.step_s:9.4g} s/step  {p.memory_bytes / 1e9:9.4g} GB"
            )
        head = self.plans[0]
        lines += ["", f"why {head.label}:", *(f"  {r}" for r in head.reasons)]
        self.text = "\n".join(lines)
        self.figure = plan_breakdown(self.plans, self.devices.memory_bytes, top=self.top)
        self._redraw()
        return self.plans

    def _controls(self, widgets: Any) -> list[Any]:
        size = widgets.FloatLogSlider(
            value=self.model.n_params, base=10, min=6, max=12, description="Ψ (params)"
        )
        count = widgets.SelectionSlider(
            options=sorted({1, 2, 4, 8, 16, 32, 64, self.devices.count}),
            value=self.devices.count,
            description="devices",
        )
        memory = widgets.FloatSlider(
            value=self.devices.memory_bytes / 1e9, min=1, max=192, description="GB/device"
        )
        options = list(PRESETS.items())
        if self.network not in PRESETS.values():  # a measured or custom network
            options.append((self.network.name or "custom", self.network))
        net = widgets.Dropdown(options=options, value=self.network, description="network")
        mixed = widgets.Checkbox(value=self.mixed_precision, description="mixed precision")

        def refresh(_change: Any) -> None:
            self.update(size.value, count.value, memory.value, net.value, mixed.value)

        for w in (size, count, memory, net, mixed):
            w.observe(refresh, names="value")
        return [size, count, memory, net, mixed]


def planner_explorer(
    model: ModelSpec | None = None,
    devices: DeviceSpec | None = None,
    network: str | Network = "NVLink",
    mixed_precision: bool = True,
) -> Any:
    """An ipywidgets explorer of the parallelism planner (``labkit.planner.plan``).

    Args:
        model: the ``ModelSpec`` (default: a 7B GPT-like model).
        devices: the ``DeviceSpec`` (default: 8 × 80 GB).
        network: a preset name or an ``lk.Network``.
        mixed_precision: as ``plan``.

    Returns:
        The ipywidgets container; its ``explorer`` attribute is the ``PlannerExplorer``.

    Raises:
        PlanError: as ``plan``.
    """
    return PlannerExplorer(model, devices, network, mixed_precision).widget()
