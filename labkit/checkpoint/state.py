"""The complete training state of one rank, as one dict that ``save`` can write.

Introduced in notebooks/19_fault_tolerance.ipynb.

Layout of ``TrainState.state_dict(step)`` (format 1)::

    {
      "format": 1,
      "step": int,                      # optimizer steps taken so far
      "model": model.state_dict(),      # DDP-wrapped models keep their "module." prefix
      "optimizer": optimizer.state_dict(),
      "scheduler": scheduler.state_dict() | None,
      "sampler": ResumableSampler.state_dict() | None,   # {"epoch", "batches_done"}
      "rng": capture_rng(),             # torch, cuda, numpy, python: this rank's own
      "extra": dict,                    # anything else the loop wants back (plain data)
    }

Every rank saves its own copy; under DDP the model and optimizer parts are equal on all
ranks, the RNG and sampler parts are not.
"""

from __future__ import annotations

from typing import Any

from labkit.checkpoint.rng import capture_rng, restore_rng

FORMAT = 1


class TrainState:
    """Bundle model, optimizer, scheduler and sampler so one call saves or restores them all.

    Args:
        model: the module (possibly wrapped in DDP).
        optimizer: its optimizer.
        scheduler: an LR scheduler, or None.
        sampler: a ``ResumableSampler`` (or anything with ``state_dict``/``load_state_dict``),
            or None.
    """

    def __init__(
        self, model: Any, optimizer: Any, scheduler: Any = None, sampler: Any = None
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.sampler = sampler

    def state_dict(self, step: int, extra: dict | None = None) -> dict[str, Any]:
        """Everything needed to continue bit-identically after ``step`` optimizer steps.

        Args:
            step: optimizer steps taken so far.
            extra: more plain data to save (returned by ``load_state_dict``).

        Returns:
            The dict described in the module docstring.
        """
        return {
            "format": FORMAT,
            "step": step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "sampler": self.sampler.state_dict() if self.sampler is not None else None,
            "rng": capture_rng(),
            "extra": dict(extra or {}),
        }

    def load_state_dict(self, state: dict[str, Any], rng: bool = True) -> int:
        """Restore everything from a dict made by ``state_dict``; return its step.

        Args:
            state: a dict from ``state_dict`` (e.g. via ``load``).
            rng: also restore this process's RNGs (almost always wanted).

        Returns:
            The step the state belongs to.

        Raises:
            ValueError: unknown format, or a scheduler/sampler present on one side only.
        """
        if state.get("format") != FORMAT:
            raise ValueError(f"unknown checkpoint format {state.get('format')!r}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        for name in ("scheduler", "sampler"):
            part, saved = getattr(self, name), state[name]
            if (part is None) != (saved is None):
                have = "has" if saved is not None else "has no"
                raise ValueError(
                    f"the checkpoint {have} a {name} state but this TrainState "
                    f"{'has none' if part is None else 'has one'}"
                )
            if part is not None:
                part.load_state_dict(saved)
        if rng:
            restore_rng(state["rng"])
        return int(state["step"])
