"""A persistent world of ranks for exploring cell by cell: ``lk.World`` and its requests.

Introduced in tests/notebooks/ranks_magic.ipynb (usage: docs/ranks.md). ``lk.launch`` runs one
function and tears the ranks down; a ``World`` starts ``world_size`` ranks once (forked from
the launcher's warm zygote, process group initialised), and each cell sent to it runs on every
rank — or a subset — in a namespace that persists, so a learner can step through a ring
all-reduce one send at a time and look at each rank's tensors in between::

    world = lk.World(world_size=4)          # or: %load_ext labkit, then %ranks start 4
    world.run("x = torch.ones(2) * rank")
    world.run("dist.all_reduce(x); x")      # [rank 0] tensor([6., 6.]) ... [rank 3] ...
    world.pull("x")                         # [tensor([6., 6.]), ...] back in the kernel
    world.close()

Why not ipyparallel or nbdistributed: docs/ranks.md has the measurements.
"""

from __future__ import annotations

import itertools
import linecache
import os
import shutil
import socket
import tempfile
import time
import weakref

from labkit.launcher._checks import make_plan
from labkit.launcher._payload import dumps_by_value, pickle_call
from labkit.launcher._pool import ZygoteError, get_zygote, pool_lock
from labkit.launcher.errors import RankError, RankFailure
from labkit.launcher.failure_policy import INTERRUPT_GRACE_S, STOP_GRACE_S
from labkit.launcher.stretch import stretch
from labkit.ranks._server import CELL_PREFIX, serve
from labkit.ranks._world_run import WorldRun
from labkit.ranks.cells import CellResult, RankOutput, stopped_error, timeout_error

_current: World | None = None


class World:
    """``world_size`` ranks that stay up, each keeping its variables between cells.

    Every rank's namespace starts with ``rank``, ``world_size``, ``torch``, ``dist``
    (``torch.distributed``, default group initialised) and ``lk``. The newest world is the
    one the ``%%ranks`` magic uses. ``close()``, ``lk.shutdown()``, interpreter exit and the
    kernel's death (Linux parent-death signal, kernel -> zygote -> ranks) end every rank.

    Args:
        world_size: number of ranks.
        backend: as for ``lk.launch`` (``"auto"``, ``"gloo"``, ``"labkit_shm"``, ...).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        timeout: default seconds a cell may run (and the start-up may take); a cell still
            running then is reported with every rank's stack and the world is stopped.
        verbose: also show library chatter (c10d and gloo logs).

    Raises:
        ValueError: bad arguments, before any process starts.
        RankError / LaunchTimeout: a rank failed or hung while starting.
    """

    def __init__(
        self,
        world_size: int = 4,
        backend: str = "auto",
        device: str = "auto",
        timeout: float = 60.0,
        verbose: bool = False,
    ) -> None:
        global _current
        self._plan = make_plan(world_size, backend, device, timeout, verbose)
        self.world_size = self._plan.world_size
        self.backend = self._plan.backend
        self.timeout = self._plan.timeout
        self._ids = itertools.count(1)
        self._cells = itertools.count(1)
        self._run: WorldRun | None = None
        # A private folder (0700) for the socket: only this user's processes can connect.
        folder = tempfile.mkdtemp(prefix="labkit-world-")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            address = os.path.join(folder, "cells")
            listener.bind(address)
            listener.listen(self.world_size)
            payload = pickle_call(serve, (address,), {}, self._plan.carrier)
            self._plan.import_backend_here()
            with pool_lock():
                run = WorldRun(get_zygote(), self._plan, payload, listener)
                try:
                    run.start()
                except BaseException:
                    run.stop(0.0)
                    raise
        finally:
            # Every rank has connected (or the start failed): the socket's path is not needed
            # any more, and removing it now leaves nothing in /tmp even if the kernel is killed.
            listener.close()
            shutil.rmtree(folder, ignore_errors=True)
        self._run = run
        # Stops the ranks if this object is dropped without close(), and at interpreter exit.
        self._finalizer = weakref.finalize(self, _stop, run, 0.0)
        _current = self

    # -- state ----------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        """True while every rank is up and the world takes cells."""
        return self._run is not None

    @property
    def pids(self) -> list[int]:
        """Process ids of the ranks, in rank order."""
        return list(self._run.pids) if self._run else []

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"World(world_size={self.world_size}, backend={self.backend!r}, {state})"

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests -------------------------------------------------------------------------
    def run(
        self,
        code: str,
        ranks: list[int] | None = None,
        timeout: float | None = None,
        show: bool = True,
    ) -> CellResult:
        """Run ``code`` on ``ranks`` (default: all), each in its persistent namespace.

        Args:
            code: Python source, as in a notebook cell; the last expression's value is shown.
            ranks: which ranks run it (the others stay idle); default all.
            timeout: seconds before the cell is given up (default: the world's timeout), stretched
                by ``LABKIT_TIMEOUT_SCALE`` (:mod:`labkit.launcher.stretch`).
            show: print each rank's output, grouped by rank and prefixed ``[rank r]``.

        Returns:
            The per-rank outputs (``CellResult``).

        Raises:
            CellError: the cell raised on some rank(s); the world stays usable.
            CellTimeout: the cell was still running at the timeout (e.g. a collective that
                only some ranks entered); shows each rank's stack; the world was stopped.
            WorldStopped: a rank died; the world was stopped.
        """
        filename = f"{CELL_PREFIX}{next(self._cells)}>"
        # The kernel shows stack dumps of this cell too: its lines go into our linecache.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        targets = self._targets(ranks)
        msgs = {r: {"op": "exec", "code": code, "filename": filename} for r in targets}
        replies = self._request(msgs, timeout)
        result = CellResult(
            {
                r: RankOutput(r, m["stdout"], m["stderr"], m["value"], m["error"])
                for r, m in replies.items()
            }
        )
        if show:
            result.show()
        error = result.error(self.world_size)
        if error is not None:
            raise error
        return result

    def pull(self, name: str, ranks: list[int] | None = None) -> list:
        """Bring a variable back from the ranks: one value per rank, in rank order.

        Args:
            name: the variable's name in the ranks' namespaces.
            ranks: which ranks (default all).

        Returns:
            The values (unpickled in the kernel; tensors come back as CPU copies if CPU).

        Raises:
            CellError: a rank does not have it, or it cannot be sent.
        """
        import cloudpickle

        targets = self._targets(ranks)
        replies = self._request({r: {"op": "pull", "name": name} for r in targets}, None)
        result = CellResult({r: RankOutput(r, error=m.get("error")) for r, m in replies.items()})
        error = result.error(self.world_size)
        if error is not None:
            raise error
        return [cloudpickle.loads(replies[r]["data"]) for r in targets]

    def push(self, ranks: list[int] | None = None, **values) -> None:
        """Set variables on the ranks, e.g. ``world.push(lr=0.1, data=tensor)``.

        Args:
            ranks: which ranks (default all).
            **values: names and values (sent by value with cloudpickle).
        """
        data = dumps_by_value(values)  # lk.launch's pickler: notebook functions go by value
        self._request({r: {"op": "push", "values": data} for r in self._targets(ranks)}, None)

    def close(self) -> None:
        """Stop every rank (a clean exit first, then SIGKILL); safe to call twice."""
        self._close(STOP_GRACE_S)

    def _close(self, grace_s: float) -> None:
        global _current
        run, self._run = self._run, None
        if _current is self:
            _current = None
        if run is not None:
            self._finalizer.detach()
            _stop(run, grace_s)

    # -- internals ------------------------------------------------------------------------
    def _targets(self, ranks: list[int] | None) -> list[int]:
        if self._run is None:
            raise RuntimeError(
                "this world has stopped: start a new one (lk.World(world_size=...) or "
                "%ranks start N); the ranks' variables are gone"
            )
        if ranks is None:
            return list(range(self.world_size))
        bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < self.world_size]
        if bad or not ranks:
            raise ValueError(
                f"ranks must be a non-empty list of ranks in 0..{self.world_size - 1}, "
                f"got {list(ranks)}"
            )
        return sorted(set(ranks))

    def _request(self, msgs: dict[int, dict], timeout: float | None) -> dict[int, dict]:
        timeout = self.timeout if timeout is None else stretch(timeout)  # stretched already
        run = self._run
        with pool_lock():
            if run.zygote_gone():
                self._zygote_died()
            rid = next(self._ids)
            run.replies.clear()
            for rank, msg in msgs.items():
                run.send(rank, {**msg, "id": rid})
            deadline = time.monotonic() + timeout
            try:
                while True:
                    got = {r: m for r, m in run.replies.items() if m["id"] == rid}
                    if len(got) == len(msgs):
                        return got
                    if run.broken_ranks():
                        self._broken(run)
                    if time.monotonic() >= deadline:
                        self._timed_out(run, list(msgs), sorted(set(msgs) - set(got)), timeout)
                    run.poll(min(0.2, max(0.0, deadline - time.monotonic())))
            except ZygoteError:
                self._zygote_died()
            except KeyboardInterrupt:
                self._interrupted(run, rid, msgs)
                raise

    def _zygote_died(self) -> None:
        self._close(0.0)
        failures = {
            r: RankFailure(r, "died", "was stopped with labkit's zygote (lk.shutdown())")
            for r in range(self.world_size)
        }
        raise stopped_error(
            failures,
            self.world_size,
            headline="every rank was stopped with labkit's zygote (lk.shutdown() or a crash)",
        )

    def _broken(self, run: WorldRun) -> None:
        try:
            run.raise_if_broken()
        except RankError as exc:
            self._close(0.0)
            raise stopped_error(exc.failures, self.world_size) from None

    def _timed_out(
        self, run: WorldRun, targets: list[int], stuck: list[int], timeout: float
    ) -> None:
        stacks = run.stacks(list(range(self.world_size)))
        self._close(0.0)
        raise timeout_error(self.world_size, targets, stuck, stacks, timeout)

    def _interrupted(self, run: WorldRun, rid: int, msgs: dict) -> None:
        """Ctrl-C: interrupt the cell on the ranks; stop the world if they do not come back."""
        running = [r for r in msgs if run.replies.get(r, {}).get("id") != rid]
        run.interrupt(running)
        end = time.monotonic() + INTERRUPT_GRACE_S
        while time.monotonic() < end and not run.broken_ranks():
            if all(run.replies.get(r, {}).get("id") == rid for r in msgs):
                return
            run.poll(0.05)
        self._close(0.0)


def current_world() -> World | None:
    """The world the ``%%ranks`` magic uses: the newest one still running, or None."""
    return _current if _current is not None and _current.alive else None


def _stop(run: WorldRun, grace_s: float) -> None:
    with pool_lock():
        run.stop(grace_s)
