"""Turn a failed launch of a learner's function into one sentence that names the cause.

Introduced in notebooks/00_setup_and_launcher.ipynb.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.exercises import ExerciseFailed
from labkit.launcher import LaunchTimeout, RankError, launch

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


def not_attempted(exc: RankError) -> bool:
    """True when every failing rank raised ``NotImplementedError`` (the exercise is not written)."""
    return all(f.exc_type == "NotImplementedError" for f in exc.failures.values())


def launch_learner(
    run: Callable[..., Any],
    world_size: int,
    *,
    backend: Any,
    args: tuple,
    timeout_s: float,
    hang: str,
    ranks: str = "ranks",
) -> list[Any]:
    """Run a checker's rank function on CPU ranks; a hang or a rank's error fails the exercise.

    Args:
        run: the checker's function for each rank, ``run(rank, world_size, *args)``.
        world_size: ranks to launch.
        backend: as ``lk.launch`` (a name or a ``BackendSpec``).
        args: extra arguments of ``run`` (the learner's function among them).
        timeout_s: seconds before a launch that has not finished counts as a hang.
        hang: what to tell the learner when it hangs (a sentence).
        ranks: the word after the world size in messages ("ranks" or "rank(s)").

    Returns:
        Every rank's return value, in rank order.

    Raises:
        ExerciseFailed: the launch hung (with ``hang`` and where each rank was), or a rank
            raised (naming the rank that failed in its own right).
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet; the
            caller checks the reference instead).
    """
    try:
        return launch(
            run, world_size=world_size, backend=backend, device="cpu", args=args, timeout=timeout_s
        )
    except LaunchTimeout as exc:
        raise ExerciseFailed(
            f"on {world_size} {ranks} the function did not finish within {timeout_s:g} s. "
            f"{hang}\n" + exc.headline
        ) from exc
    except RankError as exc:
        if not_attempted(exc):
            raise  # not attempted: check() runs the reference instead
        raise ExerciseFailed(f"on {world_size} {ranks}, {first_cause(exc)}") from exc
