"""Tests for labkit/preflight/cluster.py: the same versions on every rank, a directory all see.

The checks run on real ranks (``lk.launch`` over gloo); a mismatch is injected by changing
``torch.__version__`` on one rank. ``labkit doctor`` runs under a real ``torchrun``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.preflight import cluster

ROOT = Path(__file__).resolve().parents[1]


def _versions(rank: int, world_size: int, odd_rank: int | None = None) -> object:
    if rank == odd_rank:
        torch.__version__ = "2.14.1+cu130"  # this rank's process only
    try:
        return cluster.check_versions()
    except cluster.VersionMismatch as exc:
        return str(exc)


def test_versions_agree_on_every_rank() -> None:
    out = lk.launch(_versions, 2, backend="gloo", device="cpu")
    assert out[0] == out[1]  # every rank gets every rank's row
    assert [r.rank for r in out[0]] == [0, 1]
    assert {r.torch for r in out[0]} == {torch.__version__}
    assert all(r.labkit == lk.__version__ for r in out[0])


def test_a_mismatch_on_one_rank_fails_on_every_rank_naming_it() -> None:
    out = lk.launch(_versions, 3, backend="gloo", device="cpu", kwargs={"odd_rank": 1})
    assert all(isinstance(m, str) for m in out)  # every rank raised, nobody hangs
    assert out[0] == out[1] == out[2]
    text = out[0]
    assert f"torch: {torch.__version__!r} on ranks 0, 2" in text
    assert "'2.14.1+cu130' on rank 1 (on " in text
    assert "Rank 1 (on " in text and "differs from rank 0" in text
    assert "pip install -r requirements.txt" in text  # what to do


def _row(rank: int, host: str, **changes: str) -> cluster.RankVersions:
    base = {"torch": "2.13.0", "cuda": "13.0", "nccl": "2.27.7", "python": "3.11.7"}
    base.update(changes)
    return cluster.RankVersions(rank=rank, host=host, labkit="0.1.0", **base)


def test_message_names_hosts_and_every_field_that_differs() -> None:
    rows = [
        _row(0, "node-a"),
        _row(1, "node-a"),
        _row(2, "node-b", nccl="2.21.5"),
        _row(3, "node-b", nccl="2.21.5", cuda="12.6"),
    ]
    text = cluster.mismatch_message(rows)
    assert "nccl: '2.27.7' on ranks 0, 1 (on node-a); '2.21.5' on ranks 2, 3 (on node-b)" in text
    assert "cuda: '13.0' on ranks 0, 1, 2 (on node-a, node-b); '12.6' on rank 3" in text
    assert "torch:" not in text  # only what differs
    assert "Ranks 2, 3 (on node-b) differ from rank 0" in text
    assert cluster.mismatch_message(rows[:2]) is None


def test_fields_can_be_narrowed_and_unknown_ones_are_refused() -> None:
    rows = [_row(0, "a"), _row(1, "b", python="3.12.1")]
    assert cluster.mismatch_message(rows, fields=("torch", "nccl")) is None
    with pytest.raises(ValueError, match="unknown fields"):
        cluster.check_versions(fields=("driver",))


def _shared(rank: int, world_size: int, paths: list[str]) -> object:
    try:
        result = cluster.check_shared_dir(paths[rank])
        return result.ok, result.seen, sorted(os.listdir(paths[rank]))
    except cluster.SharedDirError as exc:
        return str(exc)


def test_a_directory_every_rank_sees_passes_and_is_left_clean(tmp_path: Path) -> None:
    shared = str(tmp_path / "ckpt")  # created by rank 0
    out = lk.launch(_shared, 2, backend="gloo", device="cpu", args=([shared, shared],))
    assert out[0][:2] == (True, ["ok", "ok"])
    assert os.listdir(shared) == []  # the probe file is removed again


def test_a_node_local_directory_fails_naming_the_ranks_that_cannot_see_it(tmp_path) -> None:
    # Ranks 1 and 2 look at their "own" disk, as on nodes without shared storage.
    paths = [str(tmp_path / f"node{r}") for r in range(3)]
    out = lk.launch(_shared, 3, backend="gloo", device="cpu", args=(paths,))
    assert all(isinstance(m, str) for m in out) and out[0] == out[2]
    assert "2 of 3 ranks cannot see the file rank 0" in out[0]
    assert "rank 1 on " in out[0] and "rank 2 on " in out[0] and "rank 0 on " not in out[0]
    assert "no such file" in out[0] and "every node mounts" in out[0]


@pytest.mark.slow
@pytest.mark.parametrize("entry", [["-m", "labkit.cli", "doctor"], ["-m", "labkit.preflight"]])
def test_labkit_doctor_under_torchrun_checks_every_rank(entry, tmp_path) -> None:
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", TORCH_CPP_LOG_LEVEL="ERROR")
    env["PYTHONPATH"] = str(ROOT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    shared = str(tmp_path / "shared")
    proc = subprocess.run(
        [*cmd, *entry, "--shared-dir", shared],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    words = " ".join(out.split())  # the table wraps long lines
    assert "ok job rank 0 of 2" in words
    assert "ok versions 2 ranks on 1 host(s) agree: torch " + torch.__version__ in words
    assert f"ok shared dir all 2 ranks on 1 host(s) read rank 0's file in {shared}" in words
    assert "rank 1 of 2" not in out  # one report per machine: rank 1 shares rank 0's
