"""Errors raised by ``lk.launch`` when ranks fail: which rank, what happened, what to do.

Introduced in notebooks/00_setup_and_launcher.ipynb (``RankError``) and
notebooks/01_point_to_point.ipynb (``LaunchTimeout``, the deadlock lesson).
"""

from __future__ import annotations

import linecache
import re
import signal
from dataclasses import dataclass


@dataclass
class RankFailure:
    """What went wrong on one rank.

    ``kind`` is ``"raised"`` (the function raised), ``"died"`` (the process ended without a
    result: killed, ``os._exit``, a crash) or ``"stuck"`` (still running at the timeout).
    """

    rank: int
    kind: str
    summary: str
    details: str = ""
    exit_code: int | None = None
    exc_type: str | None = None
    stack: str = ""
    at: float = 0.0  # when the launcher learnt of it (monotonic seconds): the root cause is
    # usually the earliest; peers then fail with "Connection closed by peer" and the like


def describe_exit(code: int | None) -> str:
    """Human words for a process exit code (negative codes are signals)."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = {
            "SIGKILL": " (killed: out of memory, or someone ran kill -9)",
            "SIGSEGV": " (segmentation fault: a crash in native code)",
            "SIGABRT": " (aborted by native code)",
        }.get(name, "")
        return f"was killed by {name} ({-code}){hint}"
    return f"exited with code {code} without returning a result"


def format_remote_traceback(msg: dict) -> str:
    """Render a rank's traceback, filling in source lines only this process knows.

    Functions defined in a notebook cell carry file names like ``/tmp/ipykernel_1/123.py``
    whose text lives in the kernel's linecache, not in the rank that ran them.
    """
    lines = ["Traceback (most recent call last):\n"]
    for filename, lineno, name, line in msg["frames"]:
        if _is_launcher_file(filename):
            continue  # the launcher's own frames are not the learner's business
        lines.append(f'  File "{filename}", line {lineno}, in {name}\n')
        text = line or linecache.getline(filename, lineno or 0).strip()
        if text:
            lines.append(f"    {text}\n")
    lines.append(msg["exception"])
    return "".join(lines)


def _is_launcher_file(filename: str) -> bool:
    return "labkit/launcher/" in filename.replace("\\", "/") or filename.startswith("<frozen runpy")


def clean_stack_dump(text: str) -> str:
    """A faulthandler dump, innermost call last, without launcher frames, with source lines."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        if not lines:
            continue
        frames = []
        for frame in lines[1:]:
            m = _FRAME.match(frame)
            if m and _is_launcher_file(m["file"]):
                continue
            frames.append(frame)
            if m:
                src = linecache.getline(m["file"], int(m["line"])).strip()
                if src:
                    frames.append(f"    {src}")
        if frames:
            out.append(lines[0].replace("most recent call first", "innermost call last"))
            # Reverse frame by frame, keeping each source line under its frame.
            grouped: list[list[str]] = []
            for line in frames:
                if line.startswith("    ") and grouped:
                    grouped[-1].append(line)
                else:
                    grouped.append([line])
            for group in reversed(grouped):
                out.extend(group)
    return "\n".join(out)


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>.*)$')


class RankError(RuntimeError):
    """One or more ranks failed; ``failures`` maps each failed rank to its ``RankFailure``."""

    def __init__(
        self,
        failures: dict[int, RankFailure],
        world_size: int,
        stopped: list[int],
        headline: str | None = None,
        advice: str = "",
    ):
        self.failures = dict(sorted(failures.items()))
        self.world_size = world_size
        self.stopped = stopped
        self.ranks = list(self.failures)
        first = min(self.failures.values(), key=lambda f: (f.at, f.rank))
        self.first = first
        self.headline = headline or (
            f"rank {first.rank} {first.summary}"
            if len(self.failures) == 1
            else f"ranks {_join(self.ranks)} failed; the first to fail was rank {first.rank}, "
            f"which {first.summary} (the others often fail because of it)"
        )
        self.advice = advice
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [self.headline]
        if len(self.failures) > 1:
            parts.extend(f"  rank {f.rank} {f.summary}" for f in self.failures.values())
        for f in self.failures.values():
            body = f.details or f.stack
            if body:
                parts.append(f"\n--- rank {f.rank} ({f.kind}) ---\n{body.rstrip()}")
        if self.stopped:
            parts.append(
                f"\nThe other rank(s) {_join(self.stopped)} were stopped; no rank is left running."
            )
        if self.advice:
            parts.append(self.advice)
        return "\n".join(parts)


class LaunchTimeout(RankError, TimeoutError):
    """No result within the launch's ``timeout``; the message shows where every rank was."""


def _join(ranks) -> str:
    return ", ".join(str(r) for r in ranks)
