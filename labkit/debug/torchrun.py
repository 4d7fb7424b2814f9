"""Run a module under ``torchrun`` on this machine: loopback only, with a deadline, output kept.

Introduced in notebooks/19_fault_tolerance.ipynb (section 5, debugging a distributed job).

A real job gets its debug switches the way a worker gets any setting: from the environment
torchrun starts it with, before ``import torch``. This runs ``python -m
torch.distributed.run`` with the c10d rendezvous on 127.0.0.1 (a free port), gloo's and
NCCL's sockets on the loopback interface unless ``env`` says otherwise, in its own session so
that a timeout kills the agent and its workers together.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TorchrunResult:
    """A finished torchrun run.

    Attributes:
        returncode: the agent's exit code (0: every worker exited 0).
        output: stdout and stderr of the agent and its workers, interleaved.
    """

    returncode: int
    output: str


def run_torchrun(
    module: str,
    args: Sequence[str] = (),
    nproc: int = 2,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> TorchrunResult:
    """``torchrun --nnodes 1 --nproc-per-node nproc -m module *args`` on loopback.

    Args:
        module: the module the workers run (``"labkit.scripts.debug_collectives"``).
        args: its command-line arguments.
        nproc: workers to start.
        env: variables to add to this process's environment for the agent and its workers
            (``{"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}``). ``GLOO_SOCKET_IFNAME`` and
            ``NCCL_SOCKET_IFNAME`` default to the loopback interface and
            ``TORCH_CPP_LOG_LEVEL`` to ``ERROR`` (c10d's per-rank hostname warning).
        timeout: seconds before the agent and its workers are killed.

    Returns:
        The ``TorchrunResult``.

    Raises:
        subprocess.TimeoutExpired: the run did not finish within ``timeout`` (everything it
            started has been killed).
    """
    from labkit.launcher._checks import loopback_interface

    with socket.socket() as s:  # a free port for the rendezvous store, on loopback
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    full_env = dict(os.environ, TORCH_CPP_LOG_LEVEL="ERROR")
    lo = loopback_interface()
    if lo:
        full_env.update(GLOO_SOCKET_IFNAME=lo, NCCL_SOCKET_IFNAME=lo)
    full_env.update(env or {})
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
        "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--monitor-interval", "0.2",
        "-m", module, *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return TorchrunResult(proc.returncode, output)
