"""Figures for the course: every function returns a matplotlib Figure (tests call them headless).

Importing ``labkit.viz`` loads matplotlib; ``import labkit`` alone does not.
Each submodule serves the notebooks named in its docstring; re-export public functions here.
"""

from __future__ import annotations

__all__: list[str] = []
