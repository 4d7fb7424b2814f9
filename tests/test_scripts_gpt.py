"""``labkit.scripts.train_gpt`` under real torchrun, against the single-process reference.

- ``--strategy tp`` on one agent with 2 processes and ``--strategy pp`` on two agents
  ("nodes", one process each, c10d rendezvous over loopback) end with the losses and the
  full parameters of ``lk.capstone.train_reference`` (the tolerances of
  tests/test_capstone.py), every rank printing the same checksum;
- a strategy the world size cannot take stops every rank at once with the arithmetic.

The torchrun runs take several seconds each on a 2-core machine, hence ``slow``.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch

import labkit as lk
from labkit.scripts import train_gpt
from tests.test_scripts_torchrun import _env, _free_port, _run_all, _torchrun

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"dim": 16, "n_layers": 2, "n_heads": 2, "seq_len": 8, "steps": 2, "eval_every": 1}
OPTIONS = [f"--{k.replace('_', '-')}={v}" for k, v in SIZES.items()]


def _script(strategy: str, out: Path | None, *extra: str) -> list[str]:
    return [
        "-m",
        "labkit.scripts.train_gpt",
        "--strategy",
        strategy,
        "--batch-size",
        "8",
        "--microbatches",
        "2",
        "--timeout",
        "60",
        *OPTIONS,
        *extra,
        *(["--out", str(out)] if out else []),
    ]


@pytest.fixture(scope="module")
def reference() -> dict:
    config = lk.capstone.RunConfig(**SIZES, batch=8, val_batch=8)
    return {"config": config, **lk.capstone.train_reference(config)}


def _check(saved: dict, outputs: list[str], reference: dict, strategy: str) -> None:
    config = reference["config"]
    assert (saved["strategy"], saved["world_size"], saved["batch"]) == (strategy, 2, 8)
    assert saved["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert saved["val_losses"] == pytest.approx(reference["val_losses"], rel=1e-5)
    assert saved["val_steps"] == reference["val_steps"] == [0, 1, 2]
    want = dict(reference["model"].named_parameters())
    assert saved["params"].keys() == want.keys()
    for k in want:  # Adam moves near-zero gradients by up to lr: allow lr/10
        torch.testing.assert_close(
            saved["params"][k], want[k].detach(), rtol=0, atol=config.lr / 10
        )
    text = "\n".join(outputs)
    # Rank 0 printed each step's loss and the throughput; every rank its bytes and the checksum.
    for k, loss in enumerate(saved["losses"]):
        assert f"[rank 0] step {k + 1} loss {loss:.4f}" in text
    assert "tokens/s (64 tokens per step)" in text
    assert text.count(f"sha256={saved['sha256']}") == 2
    n = lk.models.count_parameters(reference["model"])
    totals = [sum(b.values()) for b in saved["bytes"]]
    for r, total in enumerate(totals):
        assert f"[rank {r}] bytes" in text and f"total={total}" in text
    # Plain data parallelism holds >= 16 bytes per parameter (fp32 weights, grads, Adam's
    # two states); a split model holds clearly less on each rank.
    assert max(totals) < 0.8 * 16 * n


@pytest.mark.slow
def test_tensor_parallel_on_one_node_equals_one_process(tmp_path, reference) -> None:
    out = tmp_path / "tp.pt"
    outputs = _run_all([_torchrun(_free_port(), "gpt-tp", *_script("tp", out))], tmp_path)
    _check(torch.load(out, weights_only=True), outputs, reference, "tp")


@pytest.mark.slow
def test_pipeline_on_two_nodes_over_loopback_equals_one_process(tmp_path, reference) -> None:
    port, out = _free_port(), tmp_path / "pp.pt"
    agents = [
        _torchrun(
            port,
            "gpt-pp",
            "--rdzv-conf",
            f"is_host={int(node == 0)},join_timeout=60",
            *_script("pp", out if node == 0 else None),
            nnodes=2,
            nproc=1,
        )
        for node in range(2)
    ]
    outputs = _run_all(agents, tmp_path)
    _check(torch.load(out, weights_only=True), outputs, reference, "pp")


@pytest.mark.slow
def test_a_strategy_the_world_size_cannot_take_fails_fast(tmp_path) -> None:
    cmd = _torchrun(_free_port(), "gpt-bad", *_script("dp_tp", None))
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    assert proc.returncode != 0
    assert "--strategy dp_tp on WORLD_SIZE=2" in out
    assert "needs an even p >= 4" in out
    assert "final params" not in out


def test_plan_names_what_does_not_fit() -> None:
    args = train_gpt._parser().parse_args(["--strategy", "tp", *OPTIONS])
    strategy, config = train_gpt.plan(args, 2)
    assert strategy == lk.capstone.Strategy(tp=2)
    assert (config.batch, config.val_batch, config.n_heads) == (16, 16, 2)
    assert train_gpt.plan(train_gpt._parser().parse_args(["--strategy", "zero2"]), 4)[1].batch == 64
    with pytest.raises(ValueError, match=r"tp\(4\) must divide n_heads\(2\)"):
        train_gpt.plan(args, 4)
    args = train_gpt._parser().parse_args(["--strategy", "pp", "--microbatches", "3", *OPTIONS])
    with pytest.raises(ValueError, match=r"microbatches\(3\) ∤ batch\(16\)"):
        train_gpt.plan(args, 2)
    with pytest.raises(SystemExit):  # argparse: not a strategy
        train_gpt._parser().parse_args(["--strategy", "ring"])
