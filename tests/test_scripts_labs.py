"""The lab scripts of notebooks 08, 09 and 20 under real torchrun, against references.

- ``train_ddp --accum-steps 2`` (2 micro-batches per rank per step, one all-reduce) on 2
  ranks ends with the parameters of one process stepping on the union of both ranks'
  batches (the same samples and mean gradient, summed in another order; float32: rtol
  1e-5, atol 1e-6). That run also
  passes ``--clip`` with a norm no gradient reaches (so nothing changes) and ``--profile``,
  whose per-rank Chrome traces must pass ``lk.profile.check_profiler_trace``;
- ``train_ddp --precision bf16`` differs from that fp32 reference, by little, and so does
  ``--precision fp16 --accum-steps 2 --clip`` on the CPU (fp16 autocast with
  ``GradScaler("cpu")``: the ranks agree, no step overflowed, the scale stayed 2^16);
- ``train_async --mode sync local async`` on 3 ranks, one job: sync SGD is large-batch SGD
  in one process (``reference_sgd``), local SGD is per-rank SGD with an average every H
  steps and after the last, and the parameter server (rank 0, 2 workers) applies exactly
  ``--steps`` gradients with the mean staleness ``predicted_mean_staleness`` predicts (> 0);
- bad options stop a worker before it joins the job, with exit code 2 and the reason.

All torchrun jobs start at once (one fixture), so their start-up costs overlap.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import labkit as lk
from labkit.parallel import async_sgd as A
from tests.test_scripts_torchrun import _free_port, _run_all, _torchrun

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32: the same sums in another order
STEPS = 8  # train_ddp steps (the profile takes steps 1-5)
N, H = 8, 3  # train_async: steps (updates in async mode); local SGD period

DDP = ["-m", "labkit.scripts.train_ddp", "--steps", str(STEPS), "--timeout", "60"]
ASYNC = ["-m", "labkit.scripts.train_async", "--timeout", "60"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("labs")
    jobs = {
        "accum": (
            2,
            [*DDP, "--accum-steps", "2", "--clip", "1e6", "--profile", str(tmp / "traces")],
        ),
        "bf16": (2, [*DDP, "--precision", "bf16"]),
        "fp16": (2, [*DDP, "--precision", "fp16", "--accum-steps", "2", "--clip", "1e6"]),
        "sgd": (3, [*ASYNC, "--mode", "sync", "local", "async", "--steps", str(N),
                      "--local-steps", str(H), "--slow-rank", "2", "--slowdown", "3"]),
    }  # fmt: skip
    commands = [
        _torchrun(_free_port(), name, *script, "--out", str(tmp / f"{name}.pt"), nproc=nproc)
        for name, (nproc, script) in jobs.items()
    ]
    outputs = _run_all(commands, tmp)
    return {
        name: {"text": text, **torch.load(tmp / f"{name}.pt", weights_only=True)}
        for name, text in zip(jobs, outputs, strict=True)
    } | {"traces": tmp / "traces"}


@pytest.fixture(scope="module")
def fp32() -> dict:
    """train_ddp's 2 ranks in one process: each step on the union of both ranks' batches."""
    from torch.utils.data import DataLoader, DistributedSampler

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: the same sums inside each matmul
    try:
        ds = lk.data.digits("train")
        loaders = [
            DataLoader(ds, 32, sampler=DistributedSampler(ds, 2, r, seed=0), drop_last=True)
            for r in range(2)
        ]  # epoch 0 only: STEPS < 22 batches per rank
        model = lk.models.MLP(seed=0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _, (x0, y0), (x1, y1) in zip(range(STEPS), *loaders, strict=False):
            loss = torch.nn.functional.cross_entropy(
                model(torch.cat([x0, x1])), torch.cat([y0, y1])
            )
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _close(a: dict, b: dict, **tol) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], **tol)


@pytest.mark.slow
def test_accumulation_equals_the_full_batch_and_the_profile_is_valid(runs, fp32) -> None:
    accum = runs["accum"]
    assert (accum["accum_steps"], accum["steps"], accum["world_size"]) == (2, STEPS, 2)
    _close(accum["params"], fp32, **TOL)
    assert accum["text"].count(f"sha256={accum['sha256']}") == 2  # both ranks agree
    # --clip reports the averaged gradient's norm before clipping (never reached here).
    norms = [float(t.split("grad_norm ")[1].split()[0]) for t in accum["text"].splitlines()
             if "grad_norm" in t]  # fmt: skip
    assert len(norms) == 1 and 0 < norms[0] < 1e6  # printed at step 8 (the last)
    # --profile: every rank's trace is valid and holds the 3 recorded steps.
    for r in range(2):
        with open(runs["traces"] / f"rank{r}.json", encoding="utf-8") as f:
            assert lk.profile.check_profiler_trace(json.load(f), steps=3) > 0
    assert "[rank 0] profiled steps 3-5" in accum["text"]
    assert "per step compute" in accum["text"] and "comm" in accum["text"]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_16_bit_autocast_differs_from_fp32_by_little(runs, fp32, precision: str) -> None:
    got = runs[precision]["params"]
    init = lk.models.MLP(seed=0).state_dict()
    diff = max((got[k] - fp32[k]).abs().max().item() for k in fp32)
    moved = max((fp32[k] - init[k]).abs().max().item() for k in fp32)
    assert runs[precision]["precision"] == precision
    print(f"{precision} vs fp32: max |diff| {diff:.3g}, max |fp32 - init| {moved:.3g}")
    # Far above float32's reordering (TOL), far below what training moved.
    assert 1e-4 < diff < 0.1 * moved, (diff, moved)
    text = runs[precision]["text"]
    assert text.count(f"sha256={runs[precision]['sha256']}") == 2  # both ranks agree
    if precision == "fp16":  # GradScaler("cpu"): 8 clean steps, far from growth_interval 2000
        assert runs["fp16"]["loss_scale"] == 2.0**16
        assert f"[rank 0] step {STEPS} loss " in text and "loss_scale 65536" in text
    else:
        assert runs["bf16"]["loss_scale"] is None


@pytest.mark.slow
def test_sync_mode_is_large_batch_sgd(runs) -> None:
    problem = A.digits_problem()
    ref, losses = A.reference_sgd(problem, [[(r, k) for r in range(3)] for k in range(N)])
    model = problem.model_fn()
    torch.nn.utils.vector_to_parameters(ref, model.parameters())
    sync = runs["sgd"]["modes"]["sync"]
    _close(sync["params"], model.state_dict(), **TOL)
    torch.testing.assert_close(torch.tensor(sync["losses"]), torch.tensor(losses), **TOL)
    assert sync["staleness"] == [0] * N
    assert runs["sgd"]["text"].count(f"sync params sha256={sync['sha256']}") == 3


@pytest.mark.slow
def test_local_mode_averages_every_h_steps(runs) -> None:
    problem = A.digits_problem()
    model = problem.model_fn()
    thetas = [A.initial_theta(model) for _ in range(3)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: the same sums
    for k in range(1, N + 1):
        for r, theta in enumerate(thetas):
            theta.add_(A.gradient(model, theta, problem.batch(r, k - 1), problem.loss_fn),
                       alpha=-problem.lr)  # fmt: skip
        if k % H == 0 or k == N:  # every H steps, and after the last
            mean = sum(thetas) / 3
            thetas = [mean.clone() for _ in range(3)]
    torch.set_num_threads(threads)
    torch.nn.utils.vector_to_parameters(thetas[0], model.parameters())
    local = runs["sgd"]["modes"]["local"]
    _close(local["params"], model.state_dict(), **TOL)
    assert local["update"] == [3, 6, 8]  # one row per average
    text = runs["sgd"]["text"]
    assert f"[rank 0] 3 parameter averages (every {H} local steps)" in text
    assert text.count(f"local params sha256={local['sha256']}") == 3  # replicas agree


@pytest.mark.slow
def test_async_mode_has_the_predicted_staleness(runs) -> None:
    run, text = runs["sgd"]["modes"]["async"], runs["sgd"]["text"]
    stale = run["staleness"]
    assert len(stale) == N and run["update"] == list(range(1, N + 1))
    assert sum(run["per_worker"].values()) == N and set(run["per_worker"]) == {1, 2}
    mean = sum(stale) / len(stale)
    assert mean > 0
    assert mean == pytest.approx(A.predicted_mean_staleness(N, 2), abs=1e-12)
    assert f"[rank 0] async: {N} updates from 2 workers" in text
    assert f"staleness mean {mean:.4f}" in text
    assert run["losses"][-1] < run["initial_loss"]
    # The comparison table: one row per mode, in the order given.
    table = text[text.index("[rank 0] mode    updates   wall s  updates/s  final loss") :]
    rows = re.findall(r"^\[rank 0\] (sync|local|async) +(\d+) ", table, re.MULTILINE)
    assert rows == [("sync", str(N)), ("local", str(N)), ("async", str(N))]


def _main(module, argv: list[str], monkeypatch, world_size: int = 2) -> int:
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    with pytest.raises(SystemExit) as exc:
        module.main(argv)
    return exc.value.code


def test_bad_options_stop_before_joining(monkeypatch, capsys) -> None:
    from labkit.scripts import train_async, train_ddp

    cases = [
        (train_ddp, ["--accum-steps", "0"], 2, "--accum-steps must be in 1..--batch-size (32)"),
        (train_ddp, ["--accum-steps", "33"], 2, "needs at least one sample"),
        (train_ddp, ["--clip", "0"], 2, "--clip must be > 0"),
        (train_ddp, ["--profile", "x", "--steps", "4"], 2, "needs --steps >= 5"),
        (train_async, ["--mode", "async"], 1, "needs at least 2 processes"),
        (
            train_async,
            ["--mode", "async", "--slow-rank", "0"],
            3,
            "must be a worker of --mode async, 1..2",
        ),
        (train_async, ["--mode", "sync", "--slow-rank", "3"], 3, "must be a rank, 0..2"),
        (train_async, ["--backend", "nccl"], 2, "use gloo"),
        (train_async, ["--slowdown", "0.5"], 2, "need --slowdown >= 1"),
    ]
    for module, argv, world_size, message in cases:
        assert _main(module, argv, monkeypatch, world_size) == 2, argv
        assert message in capsys.readouterr().err, argv
