"""Stream every rank's stdout and stderr into the cell, line by line, prefixed with the rank."""

from __future__ import annotations

import re
import sys
from collections import deque

# Library chatter a learner should not have to read (shown with verbose=True).
NOISE = [
    # c10d on machines without a resolvable hostname, once per rank and connection.
    re.compile(r"^\[W\S* .*socket\.cpp:\d+\].*hostname of the client socket cannot be retrieved"),
    # gloo's connection summary at every init_process_group.
    re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks"),
]


def is_noise(line: str) -> bool:
    return any(p.search(line) for p in NOISE)


class OutputRelay:
    """Turns raw bytes from the ranks' pipes into prefixed lines on this process's streams."""

    def __init__(self, verbose: bool = False, tail: int = 30) -> None:
        self.verbose = verbose
        self._partial: dict[tuple[int, str], bytes] = {}
        self._tails: dict[int, deque[str]] = {}
        self._tail = tail

    def feed(self, rank: int, stream: str, data: bytes) -> None:
        buf = self._partial.get((rank, stream), b"") + data
        *lines, rest = buf.split(b"\n")
        self._partial[(rank, stream)] = rest
        for raw in lines:
            self._emit(rank, stream, raw.decode(errors="replace"))

    def close(self, rank: int, stream: str) -> None:
        rest = self._partial.pop((rank, stream), b"")
        if rest:
            self._emit(rank, stream, rest.decode(errors="replace"))

    def stderr_tail(self, rank: int) -> str:
        """The last lines this rank wrote to stderr (for crash reports)."""
        return "\n".join(self._tails.get(rank, ()))

    def _emit(self, rank: int, stream: str, line: str) -> None:
        if stream == "err":
            self._tails.setdefault(rank, deque(maxlen=self._tail)).append(line)
        if not self.verbose and is_noise(line):
            return
        out = sys.stderr if stream == "err" else sys.stdout
        out.write(f"[rank {rank}] {line}\n")
        out.flush()
