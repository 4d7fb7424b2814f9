"""The coefficients of one cost formula: ``t(n) = steps·α + bytes·n·β + reduce·n·γ``.

Introduced in notebooks/05_communication_cost.ipynb.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CostTerms"]


@dataclass(frozen=True)
class CostTerms:
    """``t(n) = steps·α + bytes·n·β + reduce·n·γ``: the coefficients of one algorithm on p ranks.

    ``steps`` is the number of messages on the critical path (sequential α's), ``bytes`` the
    bytes on the critical path per byte of n, ``reduce`` the bytes reduced per byte of n.
    ``formula`` writes the cost out symbolically and ``source`` cites where it comes from.
    """

    steps: float
    bytes: float
    reduce: float
    formula: str
    source: str

    def time_s(self, n_bytes: float, alpha: float, beta: float, gamma: float = 0.0) -> float:
        """The cost in seconds of ``n_bytes`` with the given α, β, γ."""
        return self.steps * alpha + n_bytes * (self.bytes * beta + self.reduce * gamma)
