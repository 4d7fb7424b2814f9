"""Step through labkit's ring all-reduce chunk by chunk, every rank's buffer at every step.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

Nothing is re-implemented here: ``labkit.collectives.ring_trace`` runs the functions of
``labkit.collectives.ring`` on simulated ranks (threads and queues behind the ``P2P``
interface) and records the buffers between steps; ``lk.viz.ring_allreduce_step`` draws them.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.collectives.ring_trace import RingStep, trace_ring_allreduce
from labkit.viz.ring import ring_allreduce_step
from labkit.widgets._base import Explorer

__all__ = ["RingStepper", "ring_stepper"]


class RingStepper(Explorer):
    """Ring all-reduce on ``world_size`` simulated ranks of ``n_elements`` integers each.

    Args:
        world_size: number of simulated ranks p (1 to 16).
        n_elements: elements per rank (chunks differ by one when p does not divide it).
        seed: seed of the random integer inputs in 0..9 (exact sums, readable boxes).

    Raises:
        ValueError: ``world_size`` or ``n_elements`` out of range.
    """

    def __init__(self, world_size: int = 4, n_elements: int = 8, seed: int = 0) -> None:
        super().__init__()
        self.frame = 0
        self.configure(world_size, n_elements, seed)

    def configure(self, world_size: int, n_elements: int, seed: int = 0) -> None:
        """Run the ring all-reduce again on new inputs and show frame 0 (the inputs).

        Args:
            world_size: number of simulated ranks (1 to 16).
            n_elements: elements per rank (1 to 64).
            seed: seed of the inputs.

        Returns:
            None; ``trace`` holds the new run.

        Raises:
            ValueError: a size out of range.
        """
        if not (isinstance(world_size, int) and 1 <= world_size <= 16):
            raise ValueError(f"world_size must be an int in 1..16, got {world_size!r}")
        if not (isinstance(n_elements, int) and 1 <= n_elements <= 64):
            raise ValueError(f"n_elements must be an int in 1..64, got {n_elements!r}")
        gen = torch.Generator().manual_seed(seed)
        inputs = torch.randint(0, 10, (world_size, n_elements), generator=gen).float()
        self.world_size, self.n_elements, self.seed = world_size, n_elements, seed
        self.trace = trace_ring_allreduce(inputs)
        if self._ui is not None:
            self._slider.max = self.n_frames - 1
            self._slider.value = 0
        self.show(0)

    @property
    def n_frames(self) -> int:
        """The inputs plus one frame per step: 2(p−1) + 1."""
        return len(self.trace.steps) + 1

    def show(self, frame: int) -> RingStep | None:
        """Draw the buffers after ``frame`` steps (0: the inputs); the widget's callback.

        Args:
            frame: 0 … 2(p−1).

        Returns:
            The ``RingStep`` just shown (None for frame 0): its ``after`` buffers and
            ``transfers`` are what ``figure`` and ``text`` show.

        Raises:
            ValueError: ``frame`` out of range.
        """
        self.figure = ring_allreduce_step(self.trace, frame)
        self.frame = frame
        step = self.trace.steps[frame - 1] if frame else None
        if step is None:
            self.text = f"inputs of {self.world_size} ranks; {self.n_frames - 1} steps follow"
        else:
            moves = ", ".join(f"{t.src}→{t.dst}: chunk {t.chunk}" for t in step.transfers)
            self.text = f"{step.phase} step {step.step + 1}/{self.world_size - 1}: {moves}"
            if frame == self.n_frames - 1:
                self.text += "\nevery rank now holds the sum of all inputs"
        self._redraw()
        return step

    def _controls(self, widgets: Any) -> list[Any]:
        self._slider = widgets.IntSlider(
            value=self.frame, min=0, max=self.n_frames - 1, description="step"
        )
        play = widgets.Play(value=self.frame, min=0, max=self.n_frames - 1, interval=900)
        widgets.jslink((play, "value"), (self._slider, "value"))
        ranks = widgets.IntSlider(value=self.world_size, min=2, max=8, description="ranks")
        size = widgets.IntSlider(value=self.n_elements, min=1, max=24, description="elements")
        self._slider.observe(lambda ch: self.show(ch["new"]), names="value")

        def rerun(_change: Any) -> None:
            self.configure(ranks.value, size.value, self.seed)

        ranks.observe(rerun, names="value")
        size.observe(rerun, names="value")
        return [widgets.HBox([ranks, size]), widgets.HBox([play, self._slider])]


def ring_stepper(world_size: int = 4, n_elements: int = 8, seed: int = 0) -> Any:
    """An ipywidgets stepper through a ring all-reduce, re-run by labkit's own ring code.

    Thakur, Rabenseifner and Gropp 2005, §4: reduce-scatter, then all-gather, 2(p−1) steps.

    Args:
        world_size: number of simulated ranks.
        n_elements: elements per rank.
        seed: seed of the inputs.

    Returns:
        The ipywidgets container (``RingStepper(...).ui``); its ``explorer`` attribute is the
        ``RingStepper`` whose ``show(frame)`` the slider calls.

    Raises:
        ValueError: as ``RingStepper``.
    """
    return RingStepper(world_size, n_elements, seed).widget()
