"""The lab scripts under real torchrun: two "nodes" over loopback, and an elastic restart.

- two torchrun agents (``--nnodes 2``, one process each, c10d rendezvous on 127.0.0.1)
  end with the same parameters, bit for bit, as one agent with ``--nproc-per-node 2``;
- ``train_elastic`` with ``--max-restarts 1``: a worker SIGKILLed after step 13 on the first
  attempt, the job restarted, resumed from the step-10 checkpoint, ends bit-identical to an
  undisturbed run.

Each torchrun takes several seconds to start on a 2-core machine, hence ``slow``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 90
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        GLOO_SOCKET_IFNAME="lo",  # gloo binds and advertises loopback only
        TORCH_CPP_LOG_LEVEL="ERROR",  # no "hostname cannot be retrieved" warnings
        PYTHONPATH=str(ROOT),
    )
    return env


def _torchrun(port: int, run_id: str, *extra: str, nnodes: int = 1, nproc: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        run_id,
        "--local-addr",
        "127.0.0.1",
        "--monitor-interval",
        "0.2",
        *extra,
    ]


def _run_all(commands: list[list[str]], tmp_path: Path) -> list[str]:
    """Start every command at once (each in its own process group); wait; return outputs."""
    procs, logs = [], []
    try:
        for i, cmd in enumerate(commands):
            log = open(tmp_path / f"agent{i}.log", "w+")  # noqa: SIM115 - closed below
            logs.append(log)
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=ROOT,
                    env=_env(),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        codes = [p.wait(timeout=RUN_TIMEOUT_S) for p in procs]
        outputs = []
        for log in logs:
            log.seek(0)
            outputs.append(log.read())
        for code, out in zip(codes, outputs, strict=True):
            assert code == 0, f"torchrun exited with {code}:\n{out[-4000:]}"
        return outputs
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        for log in logs:
            log.close()


def _params(path: Path) -> dict:
    return torch.load(path, weights_only=True)


def _assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_two_nodes_over_loopback_equal_one_node(tmp_path) -> None:
    script = ["-m", "labkit.scripts.train_ddp", "--steps", "12", "--timeout", "60"]
    one = tmp_path / "one.pt"
    _run_all([_torchrun(_free_port(), "one", *script, "--out", str(one))], tmp_path)

    port, two = _free_port(), tmp_path / "two.pt"
    # --rdzv-conf is_host: both agents are on 127.0.0.1, so say which one hosts the store.
    agents = [
        _torchrun(
            port,
            "two",
            "--rdzv-conf",
            f"is_host={int(node == 0)},join_timeout=60",
            *script,
            *(["--out", str(two)] if node == 0 else []),
            nnodes=2,
            nproc=1,
        )
        for node in range(2)
    ]
    outputs = _run_all(agents, tmp_path)
    a, b = _params(one), _params(two)
    assert a["world_size"] == b["world_size"] == 2
    _assert_bitwise_equal(a["params"], b["params"])
    assert a["sha256"] == b["sha256"]
    # Every rank of both agents printed that same checksum.
    assert sum(out.count(f"sha256={a['sha256']}") for out in outputs) == 2


def test_elastic_restart_after_a_killed_worker_is_bit_identical(tmp_path) -> None:
    def script(name: str, *extra: str) -> list[str]:
        return [
            "--max-restarts",
            "1",
            "-m",
            "labkit.scripts.train_elastic",
            "--steps",
            "26",  # 22 steps per epoch: the resumed run crosses into epoch 1
            "--every",
            "5",
            "--timeout",
            "30",
            "--ckpt-dir",
            str(tmp_path / f"ckpt_{name}"),
            "--out",
            str(tmp_path / f"{name}.pt"),
            *extra,
        ]

    _run_all([_torchrun(_free_port(), "calm", *script("calm"))], tmp_path)
    kill = ("--kill-at-step", "13", "--kill-rank", "1")
    (out,) = _run_all([_torchrun(_free_port(), "killed", *script("killed", *kill))], tmp_path)
    assert "step 13: SIGKILL" in out
    assert "resumed from" in out and "step_000010" in out
    calm, killed = _params(tmp_path / "calm.pt"), _params(tmp_path / "killed.pt")
    assert (calm["restart_count"], calm["resumed_from"]) == (0, 0)
    assert (killed["restart_count"], killed["resumed_from"]) == (1, 10)
    assert calm["epoch"] == killed["epoch"] == 1
    _assert_bitwise_equal(calm["params"], killed["params"])
