"""Automatic checks for the notebooks' exercises.

Introduced in notebooks/00_setup_and_launcher.ipynb.

Each exercise has a checker (which runs the learner's function, usually on several ranks, and
compares it with PyTorch or a single-process reference) and a reference solution. In a
notebook:

    def my_ring_token(rank, world_size): ...
    lk.exercises.check("01_ring_token", my_ring_token)

A learner function that still raises ``NotImplementedError`` is reported as "not attempted",
and the reference solution is checked in its place so the notebook still runs end to end
(headless course runs rely on that). A wrong answer raises ``ExerciseFailed`` with what differs.
The verdict and the message are in the learner's language (``labkit.lang``; the translations
are in ``messages/<lang>.json``, see ``_messages``).
The tests run every reference solution and a known-wrong one through each checker.

Notebook modules register exercises with ``@exercise(name, reference=...)``; each lives in
``labkit/exercises/nbNN.py`` next to the notebook it serves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Modules that register exercises; imported on first use.
_MODULES = (
    "nb00",
    "nb01",
    "nb02",
    "nb03",
    "nb04",
    "nb05",
    "nb06",
    "nb07",
    "nb08",
    "nb09",
    "nb10",
    "nb11",
    "nb12",
    "nb13",
    "nb14",
    "nb15",
    "nb16",
    "nb17",
    "nb18",
    "nb19",
    "nb20",
    "nb21",
)


class ExerciseFailed(AssertionError):
    """The learner's answer is wrong; the message says how."""


@dataclass(frozen=True)
class Exercise:
    name: str
    checker: Callable[[Callable], Any]
    reference: Callable
    prompt: str


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # "passed" (learner's answer), "reference" (not attempted; reference checked)
    detail: Any = None


REGISTRY: dict[str, Exercise] = {}


def exercise(name: str, reference: Callable, prompt: str = "") -> Callable:
    """Register the decorated function as the checker of exercise ``name``."""

    def wrap(checker: Callable[[Callable], Any]) -> Callable[[Callable], Any]:
        REGISTRY[name] = Exercise(name, checker, reference, prompt or (checker.__doc__ or ""))
        return checker

    return wrap


def _load() -> None:
    for mod in _MODULES:
        try:
            importlib.import_module(f"labkit.exercises.{mod}")
        except ModuleNotFoundError as exc:
            if exc.name != f"labkit.exercises.{mod}":
                raise


def get(name: str) -> Exercise:
    """The registered exercise ``name``."""
    _load()
    if name not in REGISTRY:
        raise KeyError(f"no exercise {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


def _not_attempted(exc: BaseException) -> bool:
    if isinstance(exc, NotImplementedError):
        return True
    failures = getattr(exc, "failures", None)  # a RankError from lk.launch
    return bool(failures) and all(f.exc_type == "NotImplementedError" for f in failures.values())


def check(name: str, fn: Callable) -> CheckResult:
    """Check the learner's ``fn`` for exercise ``name`` and print the verdict.

    Args:
        name: exercise name, e.g. ``"01_ring_token"``.
        fn: the learner's function.

    Returns:
        A ``CheckResult``: status ``"passed"``, or ``"reference"`` when ``fn`` is not written
        yet (raises ``NotImplementedError``) and the reference solution was checked instead.

    Raises:
        ExerciseFailed: the answer is wrong; the message says what differs.
    """
    from labkit.exercises._messages import translate, verdict

    ex = get(name)
    try:
        detail = ex.checker(fn)
    except ExerciseFailed as exc:
        # In the learner's language (lk.language()): the printed line and the raised message.
        message = translate(str(exc))
        exc.args = (message,)
        print(verdict("wrong", name=name, message=message))
        raise
    except BaseException as exc:
        if not _not_attempted(exc):
            raise
        detail = ex.checker(ex.reference)
        print(verdict("reference", name=name))
        return CheckResult(name, "reference", detail)
    print(verdict("correct", name=name))
    return CheckResult(name, "passed", detail)


def solution(name: str) -> Callable:
    """The reference solution of exercise ``name`` (peek only after trying)."""
    return get(name).reference


def names() -> list[str]:
    """Every registered exercise."""
    _load()
    return sorted(REGISTRY)
