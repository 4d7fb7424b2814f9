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


DID_NOT_FINISH = "on {world_size} {ranks} the function did not finish within {timeout_s:g} s."
RANK_FAILED = "on {world_size} {ranks}, {cause}"
DEADLOCK = "deadlock on {world_size} {ranks}: no rank finished within {timeout_s:g} s."


def launch_learner(
    run: Callable[..., Any],
    world_size: int,
    *,
    backend: Any,
    args: tuple,
    timeout_s: float,
    hang: str,
    ranks: str = "ranks",
    device: str = "cpu",
    did_not_finish: str = DID_NOT_FINISH,
    stacks: bool = False,
    failed: str = RANK_FAILED,
    hint: Callable[[str], str] | None = None,
    todo_on_any_rank: bool = False,
) -> list[Any]:
    """Run a checker's rank function on its ranks; a hang or a rank's error fails the exercise.

    Args:
        run: the checker's function for each rank, ``run(rank, world_size, *args)``.
        world_size: ranks to launch.
        backend: as ``lk.launch`` (a name or a ``BackendSpec``).
        args: extra arguments of ``run`` (the learner's function among them).
        timeout_s: seconds before a launch that has not finished counts as a hang.
        hang: what to tell the learner when it hangs (a sentence; may be empty).
        ranks: the word after the world size in messages ("ranks" or "rank(s)").
        device: as ``lk.launch``.
        did_not_finish: the hang message's first sentence, formatted with ``world_size``,
            ``ranks`` and ``timeout_s``; ``hang`` follows it.
        stacks: follow a hang's message with where every rank was (the launcher's whole
            report), not only the launcher's headline.
        failed: the message when a rank raised, formatted with ``world_size``, ``ranks`` and
            ``cause`` (``first_cause``).
        hint: advice added to that message, given the cause (``""`` for none).
        todo_on_any_rank: the learner's function runs on some ranks only (the others then
            fail waiting for them), so one rank's ``NotImplementedError`` means not attempted.

    Returns:
        Every rank's return value, in rank order.

    Raises:
        ExerciseFailed: the launch hung (with ``hang`` and where the ranks were), or a rank
            raised (naming the rank that failed in its own right).
        RankError: every failing rank raised ``NotImplementedError`` (not attempted yet; the
            caller checks the reference instead).
        NotImplementedError: with ``todo_on_any_rank``, a rank raised it.
    """
    try:
        return launch(
            run, world_size=world_size, backend=backend, device=device, args=args, timeout=timeout_s
        )
    except LaunchTimeout as exc:
        head = did_not_finish.format(world_size=world_size, ranks=ranks, timeout_s=timeout_s)
        report = str(exc) if stacks else exc.headline
        raise ExerciseFailed(" ".join(s for s in (head, hang) if s) + "\n" + report) from exc
    except RankError as exc:
        if todo_on_any_rank and any(
            f.exc_type == "NotImplementedError" for f in exc.failures.values()
        ):
            raise NotImplementedError("the learner's function is not written yet") from exc
        if not_attempted(exc):
            raise  # not attempted: check() runs the reference instead
        cause = first_cause(exc)
        message = failed.format(world_size=world_size, ranks=ranks, cause=cause)
        raise ExerciseFailed(message + (hint(cause) if hint else "")) from exc
