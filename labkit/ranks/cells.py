"""What a cell run on a world gives back: each rank's output, grouped and labelled by rank.

Introduced in tests/notebooks/ranks_magic.ipynb (see docs/ranks.md).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from labkit.launcher.errors import LaunchTimeout, RankError, RankFailure


@dataclass
class RankOutput:
    """One rank's part of a cell: what it printed, its last expression's repr, its error."""

    rank: int
    stdout: str = ""
    stderr: str = ""
    value: str | None = None  # repr of the cell's last expression (None: nothing to show)
    error: dict | None = None  # {"type", "message", "traceback"} when the cell raised


@dataclass
class CellResult:
    """The outputs of one cell, by rank (only the ranks that ran it)."""

    outputs: dict[int, RankOutput] = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.outputs)

    @property
    def failed(self) -> list[int]:
        """Ranks on which the cell raised."""
        return [r for r in self.ranks if self.outputs[r].error]

    def show(self) -> None:
        """Print every rank's output, rank by rank, each line prefixed ``[rank r]``."""
        for rank in self.ranks:
            out = self.outputs[rank]
            _write(sys.stdout, rank, out.stdout)
            _write(sys.stderr, rank, out.stderr)
            if out.value is not None:
                _write(sys.stdout, rank, out.value + "\n")

    def error(self, world_size: int) -> CellError | None:
        """A ``CellError`` naming every rank on which the cell raised, or None."""
        if not self.failed:
            return None
        failures, first_seen = {}, {}
        for rank in self.failed:
            e = self.outputs[rank].error
            same_as = first_seen.setdefault(e["traceback"], rank)
            failures[rank] = RankFailure(
                rank,
                "raised",
                f"raised {e['type']}: {e['message']}".rstrip(": "),
                # Every rank often raises the same error: show its traceback once.
                details=e["traceback"] if same_as == rank else f"(the same as rank {same_as})",
                exc_type=e["type"],
            )
        summaries = {f.summary for f in failures.values()}
        headline = (
            f"rank {self.failed[0]} {failures[self.failed[0]].summary}"
            if len(failures) == 1
            else f"ranks {_join(self.failed)} {summaries.pop()}"
            if len(summaries) == 1
            else f"the cell raised on ranks {_join(self.failed)}"
        )
        return CellError(
            failures,
            world_size,
            [],
            headline=headline,
            advice="\nThe world is still running and every rank keeps its variables: "
            "fix the cell and run it again.",
        )


def _write(stream, rank: int, text: str) -> None:
    if not text:
        return
    lines = text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
    stream.write("".join(f"[rank {rank}] {line}\n" for line in lines))
    stream.flush()


class _ShortTraceback:
    """IPython shows ``_render_traceback_`` instead of the kernel-side frames of the magic."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {self}"]


class CellError(_ShortTraceback, RankError):
    """A cell raised on one or more ranks; the world is still usable."""


class CellTimeout(_ShortTraceback, LaunchTimeout):
    """A cell did not finish within its timeout; the world was stopped."""


class WorldStopped(_ShortTraceback, RankError):
    """A rank of the world died during a cell; the world was stopped."""


def stopped_error(
    failures: dict[int, RankFailure], world_size: int, headline: str | None = None
) -> WorldStopped:
    """The error for a rank that died (or left) during a cell; the world is then stopped."""
    return WorldStopped(
        failures,
        world_size,
        [],
        headline=headline,
        advice="\nThe world was stopped (its process group cannot go on without that rank): "
        "start a new one; the ranks' variables are gone.",
    )


def timeout_error(
    world_size: int, targets: list[int], stuck: list[int], stacks: dict[int, str], timeout: float
) -> CellTimeout:
    """The error for a cell still running at its timeout, with the stuck ranks' stacks."""
    failures = {
        r: RankFailure(r, "stuck", "was still running the cell", stack=stacks.get(r, ""))
        for r in stuck
    }
    done = [r for r in targets if r not in stuck]
    idle = [r for r in range(world_size) if r not in targets]
    note = "".join(
        f"; rank(s) {_join(ranks)} {what}"
        for ranks, what in ((done, "had finished it"), (idle, "did not run it"))
        if ranks
    )
    return CellTimeout(
        failures,
        world_size,
        [],
        headline=f"the cell did not finish within timeout={timeout:g} s on rank(s) "
        f"{_join(stuck)}{note}. Where each was, innermost call last:",
        advice="\nA collective or recv that only some ranks reach waits forever: compare the "
        "stacks above. Ranks stuck inside a collective cannot be interrupted, so the world "
        "was stopped: start a new one (its variables are gone). If the cell is just slow, "
        "pass a longer timeout.",
    )


def _join(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
