"""PyTorch's own distributed test suite, run against one backend (gloo or a labkit backend).

Backends introduced in notebooks/04_custom_backend.ipynb.

PyTorch ships its backend tests in the wheel: ``DistributedTest._DistTestBase`` in
``torch.testing._internal.distributed.distributed_test``, which PyTorch's own
``test/distributed/test_distributed_spawn.py`` mixes into a ``TestDistBackend`` case whose
``setUp`` spawns one process per rank. This module does the same for the backend named by
``LABKIT_SUITE_BACKEND`` with ``WORLD_SIZE`` ranks. It is not collected by a plain ``pytest``
(its name does not start with ``test_``); ``tests/test_torch_suite.py`` runs it in a fresh
interpreter per backend and world size, e.g.::

    LABKIT_SUITE_BACKEND=labkit_shm WORLD_SIZE=2 python -m pytest tests/dist_suite.py \\
        -k "all_gather_coalesced or send_recv"

The suite reads ``BACKEND`` when it is imported (its skip decorators are evaluated then), so
the variables are set before the import, in the parent and in every rank, which finds the test
class by importing this module. Four things are added to the suite's own machinery, none of
them by editing torch's files:

- a labkit backend is registered in every rank by importing its module here, and its name is
  added to ``DistTestCases.backend_feature["plugin"]``, ``["ddp"]`` and ``["subgroup"]``
  before the suite is imported, so the tests gated on those features run on it;
- ``LABKIT_SUITE_AS_GLOO=1`` runs the tests the suite gates on the literal name ``"gloo"``
  (timeouts, ``monitored_barrier``, the gloo flavour of ``batch_isend_irecv``, ...): the suite
  sees ``BACKEND=gloo``, but every group it creates — the default group in ``_run`` and any
  ``init_process_group`` / ``new_group`` a test calls with ``backend="gloo"`` — is created on
  the labkit backend (``torch.distributed``'s functions are wrapped in the rank process);
- ranks are forked from a forkserver that has imported this module once (about 1 s a test
  instead of 10-30 s on 2 cores); ``LABKIT_SUITE_START=spawn`` restores the suite's spawn;
- the runner checks every rank's exit code, not only rank 0's (the suite's
  ``_check_return_codes`` reads only the first process). A forked rank ends with
  ``os._exit``, so an abort during interpreter shutdown shows only under
  ``LABKIT_SUITE_START=spawn`` (``tests/test_backends_shm_regressions.py`` checks that case
  with real interpreter exits).
"""

from __future__ import annotations

import functools
import importlib
import os
import unittest

import torch
import torch.distributed as dist

REAL_BACKEND = os.environ.get("LABKIT_SUITE_BACKEND", "gloo").lower()
AS_GLOO = os.environ.get("LABKIT_SUITE_AS_GLOO") == "1"
START = os.environ.get("LABKIT_SUITE_START", "forkserver")
# labkit backend -> the module that registers it (the wrappers wrap gloo by default).
LABKIT_MODULES = {
    "labkit_shm": "labkit.backends.shm",
    "labkit_record": "labkit.backends.recording",
    "labkit_simnet": "labkit.backends.simnet",
    "labkit_cpp": "labkit.backends.cpp",
}

if REAL_BACKEND != "gloo":
    importlib.import_module(LABKIT_MODULES[REAL_BACKEND])  # registers it in this process
os.environ["BACKEND"] = "gloo" if AS_GLOO else REAL_BACKEND
os.environ.setdefault("WORLD_SIZE", "2")
os.environ.setdefault("TEMP_DIR", "/tmp")  # replaced per test by the suite's setUp
# The suite initialises from a file (test_distributed_spawn.py's file:// configuration, the
# one its timeout tests need); setUp names a new file per test and _run passes it on.
os.environ.setdefault("INIT_METHOD", "file:///tmp/labkit-dist-suite-init")

from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if REAL_BACKEND != "gloo":
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add(REAL_BACKEND)

from torch.testing._internal.distributed import distributed_test  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


def _on_real_backend(fn):
    """Wrap ``init_process_group`` / ``new_group`` so that ``backend="gloo"`` means ours."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if str(kwargs.get("backend", "")).lower() == "gloo":
            kwargs["backend"] = REAL_BACKEND
        return fn(*args, **kwargs)

    return call


if AS_GLOO and REAL_BACKEND != "gloo":
    dist.init_process_group = _on_real_backend(dist.init_process_group)
    dist.new_group = _on_real_backend(dist.new_group)


class TestBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    """The suite's tests, one spawned process per rank, on ``LABKIT_SUITE_BACKEND``."""

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()

    def _spawn_processes(self) -> None:
        # A forkserver that has imported this module (torch, the suite) once: each rank is
        # forked from it in milliseconds instead of importing torch again (seconds), which
        # is what makes the suite fit in CI. A forked rank ends with os._exit, skipping the
        # interpreter's shutdown, so LABKIT_SUITE_START=spawn (the suite's own start method,
        # whose ranks exit through sys.exit) is the way to check what happens at exit.
        if START == "spawn":
            super()._spawn_processes()
            return
        ctx = torch.multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        self._start_processes(ctx.Process)

    def _start_processes(self, proc) -> None:
        # Each test's temporary directory (and init file) is new; a forked rank must learn
        # it from its arguments, not from an environment inherited when the server started.
        paths = {k: os.environ[k] for k in ("TEMP_DIR", "INIT_METHOD") if k in os.environ}
        self.processes = []
        for rank in range(int(self.world_size)):
            parent_conn, child_conn = torch.multiprocessing.Pipe()
            process = proc(
                target=self.__class__._run,
                name=f"process {rank}",
                args=(rank, self._current_test_name(), self.file_name, child_conn),
                kwargs={"paths": paths},
            )
            process.start()
            self.pid_to_pipe[process.pid] = parent_conn
            self.processes.append(process)

    @classmethod
    def _run(cls, rank, test_name, file_name, pipe, paths=None, **kwargs):
        os.environ.update(paths or {})
        if "INIT_METHOD" in (paths or {}):
            distributed_test.INIT_METHOD = paths["INIT_METHOD"]
        super()._run(rank, test_name, file_name, pipe, **kwargs)

    def _check_return_codes(self, fn, elapsed_time) -> None:
        super()._check_return_codes(fn, elapsed_time)  # raises SkipTest for a skipped test
        if fn in self.skip_return_code_checks or fn in self.special_return_code_checks:
            return
        codes = [p.exitcode for p in self.processes]
        if any(c != 0 for c in codes):
            raise AssertionError(f"rank exit codes {codes}: every rank must exit with 0")


if __name__ == "__main__":
    unittest.main()
