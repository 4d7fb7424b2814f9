"""Explore ZeRO's per-device memory: model size, DP degree, stage → a bar per stage.

Introduced in notebooks/13_zero_and_fsdp.ipynb.

The numbers are ``labkit.memory.zero_memory`` (ZeRO, Rajbhandari et al. 2020, §5 and
Figure 1), drawn by ``lk.viz.zero_memory_breakdown``.
"""

from __future__ import annotations

from typing import Any

from labkit.memory import ADAM_MIXED_K, STAGE_NAMES, STAGES, MemoryBreakdown, zero_memory
from labkit.viz.memory import zero_memory_breakdown
from labkit.widgets._base import Explorer

__all__ = ["ZeroMemoryExplorer", "zero_memory_explorer"]


class ZeroMemoryExplorer(Explorer):
    """Per-device parameters, gradients and optimizer states under each ZeRO stage.

    Args:
        n_params: Ψ, the number of parameters (default: the paper's 7.5B example).
        dp_degree: N_d, the data-parallel degree.
        stage: the stage to highlight (0 to 3).
        optimizer_bytes: K (12: mixed-precision Adam).
        device_gb: device memory to draw as a line (32: a V100-32GB, as in the paper).

    Raises:
        ValueError: as ``lk.memory.zero_memory``.
    """

    def __init__(
        self,
        n_params: float = 7.5e9,
        dp_degree: int = 64,
        stage: int = 3,
        optimizer_bytes: float = ADAM_MIXED_K,
        device_gb: float | None = 32.0,
    ) -> None:
        super().__init__()
        self.optimizer_bytes, self.device_gb = optimizer_bytes, device_gb
        self.update(n_params, dp_degree, stage)

    def update(self, n_params: float, dp_degree: int, stage: int) -> MemoryBreakdown:
        """Compute every stage's breakdown, highlight ``stage``, redraw; the widget's callback.

        Args:
            n_params: Ψ.
            dp_degree: N_d.
            stage: 0, 1, 2 or 3.

        Returns:
            The ``MemoryBreakdown`` of ``stage`` (also ``breakdown``; ``breakdowns`` holds all
            four).

        Raises:
            ValueError: as ``lk.memory.zero_memory``.
        """
        k = self.optimizer_bytes
        self.breakdowns = [zero_memory(n_params, dp_degree, s, optimizer_bytes=k) for s in STAGES]
        self.breakdown = zero_memory(n_params, dp_degree, stage, optimizer_bytes=k)
        self.n_params, self.dp_degree, self.stage = n_params, dp_degree, stage
        self.figure = zero_memory_breakdown(self.breakdowns, stage, self.device_gb)
        gb = self.breakdown.as_gb()
        fits = ""
        if self.device_gb is not None:
            fits = " (fits)" if gb["total"] <= self.device_gb else " (does not fit)"
        self.text = (
            f"stage {stage} ({STAGE_NAMES[stage]}), Ψ = {n_params / 1e9:g}B, N_d = {dp_degree}: "
            f"{gb['total']:,.4g} GB per device{fits} = {gb['params']:,.4g} parameters + "
            f"{gb['grads']:,.4g} gradients + {gb['optimizer']:,.4g} optimizer states"
        )
        self._redraw()
        return self.breakdown

    def _controls(self, widgets: Any) -> list[Any]:
        size = widgets.FloatLogSlider(
            value=self.n_params, base=10, min=8, max=12.5, description="Ψ (params)"
        )
        dp = widgets.SelectionSlider(
            options=sorted({2**i for i in range(11)} | {self.dp_degree}),
            value=self.dp_degree,
            description="DP degree",
        )
        stage = widgets.ToggleButtons(
            options=[(f"{s}: {STAGE_NAMES[s]}", s) for s in STAGES],
            value=self.stage,
            description="stage",
        )

        def refresh(_change: Any) -> None:
            self.update(size.value, dp.value, stage.value)

        for w in (size, dp, stage):
            w.observe(refresh, names="value")
        return [size, dp, stage]


def zero_memory_explorer(
    n_params: float = 7.5e9,
    dp_degree: int = 64,
    stage: int = 3,
    device_gb: float | None = 32.0,
) -> Any:
    """An ipywidgets explorer of per-device memory under ZeRO stages 0 to 3.

    ZeRO, Rajbhandari et al. 2020, Figure 1 (its defaults: Ψ = 7.5B, N_d = 64, K = 12).

    Args:
        n_params: Ψ.
        dp_degree: N_d.
        stage: the stage to highlight.
        device_gb: device memory line in GB (None: no line).

    Returns:
        The ipywidgets container; its ``explorer`` attribute is the ``ZeroMemoryExplorer``.

    Raises:
        ValueError: as ``lk.memory.zero_memory``.
    """
    return ZeroMemoryExplorer(n_params, dp_degree, stage, device_gb=device_gb).widget()
