"""Persistent ranks for exploring cell by cell: ``lk.World`` and the ``%%ranks`` magic.

Introduced in tests/notebooks/ranks_magic.ipynb; usage and design notes in docs/ranks.md.
"""

from __future__ import annotations

from labkit.ranks.cells import CellError, CellResult, CellTimeout, RankOutput, WorldStopped
from labkit.ranks.world import World, current_world

__all__ = [
    "CellError",
    "CellResult",
    "CellTimeout",
    "RankOutput",
    "World",
    "WorldStopped",
    "current_world",
]
