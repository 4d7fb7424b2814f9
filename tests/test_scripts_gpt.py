"""``labkit.scripts.train_gpt`` under real torchrun, against the single-process reference.

- ``--strategy tp`` on one agent with 2 processes and ``--strategy pp`` on two agents
  ("nodes", one process each, c10d rendezvous over loopback) end with the losses and the
  full parameters of ``lk.capstone.train_reference`` (the tolerances of
  tests/test_capstone.py), every rank printing the same checksum;
- a strategy the world size cannot take stops a worker before it joins, with the arithmetic;
- ``labkit.scripts.train_model_split`` on 2 ranks ends with one process's parameters.

The torchrun runs take several seconds each on a 2-core machine, hence ``slow``.
"""

from __future__ import annotations

import subprocess
import sys
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


def _worker(*script: str) -> subprocess.CompletedProcess:
    """One worker as torchrun would start it (rank 0 of 2), without the agent: the scripts
    check the strategy before joining the process group, so nothing waits for rank 1."""
    env = _env() | {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    return subprocess.run(
        [sys.executable, *script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_a_strategy_the_world_size_cannot_take_fails_before_joining() -> None:
    done = _worker(*_script("dp_tp", None))
    assert done.returncode == 2
    assert "--strategy dp_tp on WORLD_SIZE=2" in done.stderr
    assert "needs an even p >= 4" in done.stderr
    done = _worker("-m", "labkit.scripts.train_model_split", "--n-linear", "1")
    assert done.returncode == 2
    assert "cannot cut 1 layers into 2 stages" in done.stderr


@pytest.mark.slow
def test_model_split_on_two_ranks_equals_one_process(tmp_path) -> None:
    from labkit.scripts import train_model_split as tms

    steps, size, out = 12, 32, tmp_path / "split.pt"
    script = ["-m", "labkit.scripts.train_model_split", "--steps", str(steps), "--hidden", "32"]
    (text,) = _run_all([_torchrun(_free_port(), "mlp-split", *script, "--out", str(out))], tmp_path)
    saved = torch.load(out, weights_only=True)
    # One process: the whole MLP, the same batches, the same SGD.
    args = tms._parser().parse_args(["--hidden", "32"])
    model = tms.build(args)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    ds, losses = lk.data.digits("train"), []
    for k in range(steps):
        x, y = tms.batch(ds, k, size, args.seed)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert saved["losses"] == pytest.approx(losses, rel=1e-6)
    want = model.state_dict()
    assert saved["params"].keys() == want.keys()
    for k in want:
        torch.testing.assert_close(saved["params"][k], want[k], rtol=1e-6, atol=1e-7)
    assert text.count(f"sha256={saved['sha256']}") == 2
    # 4 Linear layers + 3 ReLU: stage 0 keeps 4 layers, stage 1 the other 3; each sends one
    # message per step of batch × hidden floats (activations forward, gradients back).
    assert "[rank 0] stage 0: 4 layers" in text and "[rank 1] stage 1: 3 layers" in text
    assert text.count(f"per step 1 sends, {size * 32 * 4} bytes sent") == 2


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
