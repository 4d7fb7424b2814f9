"""IPython magics over ``lk.World``: ``%ranks start 4``, ``%%ranks``, ``%%ranks 0,2``, ...

Introduced in tests/notebooks/ranks_magic.ipynb (usage: docs/ranks.md). Load with
``%load_ext labkit``. Line magic::

    %ranks start 4 [--backend gloo] [--timeout 60]   start a world (stops the previous one)
    %ranks stop                                        stop it; no rank process is left
    %ranks status                                      world size, backend, rank pids
    xs = %ranks pull x [--ranks 0,2]                   a variable from each rank, as a list

Cell magic: ``%%ranks`` runs the cell on every rank, ``%%ranks 0,2`` on ranks 0 and 2 only,
``%%ranks --timeout 5`` with a shorter deadline. Output comes back grouped by rank.
"""

from __future__ import annotations

import argparse
import shlex

from IPython.core.magic import Magics, line_cell_magic, magics_class

from labkit.ranks.world import World, current_world


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ValueError(f"%ranks: {message}. {USAGE}")


USAGE = (
    "Usage: %ranks start N [--backend B] [--timeout S] | %ranks stop | %ranks status | "
    "%ranks pull NAME [--ranks 0,2] | %%ranks [0,2] [--timeout S] (cell)"
)


def _ranks(text: str | None) -> list[int] | None:
    if not text or text == "all":
        return None
    try:
        return [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ValueError(f"%%ranks: ranks are written like 0,2 (got {text!r})") from None


def _line_parser() -> _Parser:
    p = _Parser(prog="%ranks", add_help=False)
    p.add_argument("command", choices=["start", "stop", "status", "pull"])
    p.add_argument("arg", nargs="?")
    p.add_argument("--backend", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--ranks", default=None)
    return p


def _cell_parser() -> _Parser:
    p = _Parser(prog="%%ranks", add_help=False)
    p.add_argument("ranks", nargs="?")
    p.add_argument("--timeout", type=float, default=None)
    return p


def _need_world() -> World:
    world = current_world()
    if world is None:
        raise RuntimeError(
            "no world is running: start one with %ranks start 4 (or lk.World(world_size=4))"
        )
    return world


@magics_class
class RanksMagics(Magics):
    """``%ranks`` / ``%%ranks``: run notebook cells on a persistent world of ranks."""

    @line_cell_magic
    def ranks(self, line: str, cell: str | None = None):
        if cell is None:
            return self._line(line)
        args = _cell_parser().parse_args(shlex.split(line))
        _need_world().run(cell, ranks=_ranks(args.ranks), timeout=args.timeout)
        return None

    def _line(self, line: str):
        args = _line_parser().parse_args(shlex.split(line))
        if args.command == "start":
            old = current_world()
            if old is not None:
                old.close()
            n = int(args.arg) if args.arg else 4
            kwargs = {"timeout": args.timeout} if args.timeout else {}
            world = World(n, backend=args.backend, device=args.device, **kwargs)
            print(f"started {world}: %%ranks runs a cell on every rank")
            return None
        if args.command == "stop":
            world = current_world()
            if world is not None:
                world.close()
                print("stopped the world: no rank is left running")
            return None
        if args.command == "status":
            world = current_world()
            print(f"{world}, rank pids {world.pids}" if world else "no world is running")
            return None
        if not args.arg:
            raise ValueError(f"%ranks pull needs a variable name. {USAGE}")
        return _need_world().pull(args.arg, ranks=_ranks(args.ranks))


def load(ip) -> None:
    """Register the magics with an IPython shell (``%load_ext labkit`` calls this)."""
    ip.register_magics(RanksMagics)
