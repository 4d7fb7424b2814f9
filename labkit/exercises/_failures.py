"""Turn a failed launch of a learner's function into one sentence that names the cause.

Introduced in notebooks/00_setup_and_launcher.ipynb.
"""

from __future__ import annotations

from labkit.launcher import RankError

# Errors a rank gets because *another* rank died first (gloo sees the socket close).
_COLLATERAL = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def first_cause(exc: RankError) -> str:
    """Name the rank that failed in its own right and its error, in one line.

    A rank whose peer crashed fails too, with a gloo "Connection closed by peer" error; the
    learner needs the peer's error, so ranks with such collateral errors come last.

    Args:
        exc: the ``RankError`` from ``lk.launch``.

    Returns:
        The rank and its one-line summary, e.g. ``"rank 2 raised ValueError: bad"``.
    """
    failures = list(exc.failures.values())
    own = [f for f in failures if not any(s in f.summary for s in _COLLATERAL)]
    first = (own or failures)[0]
    return f"rank {first.rank} {first.summary}"
