"""Tests for labkit/parallel/async_sgd.py (and sync_sgd.py, sgd_problem.py it re-exports).

The parameter server with one worker is sequential SGD bit for bit; with more workers the
staleness is ≥ 0 and the server applies exactly the gradients the workers pushed. Sync SGD is
single-process large-batch SGD; local SGD with H = 1 is sync SGD, and with H > 1 every rank
holds the same parameters after each averaging round. A straggler contributes fewer updates
to the asynchronous run (its delay is injected, 4×) and changes nothing in the synchronous one.
"""

from __future__ import annotations

import time

import pytest
import torch

import labkit as lk
from labkit.parallel import async_sgd as A

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32; summation order differs from the reference
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def problem() -> A.Problem:
    return A.regression_problem(n_samples=256)


def _launch(fn, world_size: int, *args):
    return lk.launch(fn, world_size, backend="gloo", device="cpu", args=args, timeout=TIMEOUT)


def _server(rank, world_size, problem, updates, straggler=None, step_time_s=0.0):
    return A.parameter_server(problem, updates, straggler=straggler, step_time_s=step_time_s)


def _sync(rank, world_size, problem, steps, straggler=None, step_time_s=0.0):
    return A.sync_sgd(problem, steps, straggler=straggler, step_time_s=step_time_s)


def _local(rank, world_size, problem, steps, period):
    return A.local_sgd(problem, steps, period)


def test_one_worker_is_sequential_sgd_bit_for_bit(problem) -> None:
    server, worker = _launch(_server, 2, problem, 12)
    ref, losses = A.reference_sgd(problem, [[(1, k)] for k in range(12)])
    assert torch.equal(server.params, ref)
    before_last, _ = A.reference_sgd(problem, [[(1, k)] for k in range(11)])
    assert torch.equal(worker.params, before_last)  # the last parameters it pulled
    assert server.loss == losses
    assert server.staleness == [0] * 12
    assert server.update == list(range(1, 13))
    assert worker.gradients == server.gradients == 12 == server.per_worker[1]
    assert server.worker == [1] * 12


def test_two_workers_stale_and_every_push_applied(problem) -> None:
    logs = _launch(_server, 3, problem, 20)
    server, workers = logs[0], logs[1:]
    assert server.update == list(range(1, 21))
    assert min(server.staleness) >= 0
    assert sum(w.gradients for w in workers) == server.gradients == 20
    assert server.per_worker == {w.rank: w.gradients for w in workers}
    assert sorted(set(server.worker)) == [1, 2]
    # Every update is counted by each other in-flight gradient: the mean is fixed by N and W.
    assert sum(server.staleness) / 20 == pytest.approx(A.predicted_mean_staleness(20, 2))
    # Replay in one process: update u applied worker w's k-th gradient (batch (w, k)),
    # computed on version u − 1 − staleness. The result must be the server's, bit for bit.
    model = problem.model_fn()
    versions = [A.initial_theta(model)]
    counts = dict.fromkeys(server.per_worker, 0)
    for u, w, stale in zip(server.update, server.worker, server.staleness, strict=True):
        read = versions[u - 1 - stale]
        g = A.gradient(model, read, problem.batch(w, counts[w]), problem.loss_fn)
        counts[w] += 1
        versions.append(versions[-1].clone().add_(g, alpha=-problem.lr))
    assert torch.equal(versions[-1], server.params)


def test_sync_sgd_is_large_batch_sgd(problem) -> None:
    logs = _launch(_sync, 3, problem, 6)
    ref, losses = A.reference_sgd(problem, [[(r, k) for r in range(3)] for k in range(6)])
    for log in logs:
        torch.testing.assert_close(log.params, ref, **TOL)
        assert torch.equal(log.params, logs[0].params)  # replicas never differ
        assert log.gradients == 6
    torch.testing.assert_close(torch.tensor(logs[0].loss), torch.tensor(losses), **TOL)
    assert logs[0].staleness == [0] * 6


def test_local_sgd_with_period_one_is_sync_sgd(problem) -> None:
    local = _launch(_local, 2, problem, 5, 1)
    sync = _launch(_sync, 2, problem, 5)
    for a, b in zip(local, sync, strict=True):
        torch.testing.assert_close(a.params, b.params, **TOL)
    assert local[0].update == sync[0].update == [1, 2, 3, 4, 5]


def test_local_sgd_ranks_agree_after_every_average(problem) -> None:
    logs = _launch(_local, 3, problem, 7, 3)
    assert logs[0].update == [3, 6, 7]  # every H = 3 steps, and once after the last step
    for log in logs:
        assert len(log.averaged) == 3
        for mine, rank0 in zip(log.averaged, logs[0].averaged, strict=True):
            assert torch.equal(mine, rank0)
    sync = _launch(_sync, 3, problem, 7)[0]
    assert not torch.allclose(logs[0].params, sync.params, **TOL)  # a different algorithm


@pytest.mark.slow  # injected delays: about a second of sleeping
def test_straggler_contributes_fewer_updates_async(problem) -> None:
    logs = _launch(_server, 3, problem, 24, (1, 4.0), 0.01)
    server = logs[0]
    assert server.gradients == 24 == logs[1].gradients + logs[2].gradients
    assert server.per_worker[1] < server.per_worker[2]  # 40 ms vs 10 ms per gradient
    # The straggler changes which gradients are stale, not the mean staleness.
    assert sum(server.staleness) / 24 == pytest.approx(A.predicted_mean_staleness(24, 2))
    assert max(server.staleness) >= 2  # its gradients saw several fast updates in flight


def test_predicted_mean_staleness_closed_form() -> None:
    assert A.predicted_mean_staleness(10, 1) == 0.0
    assert A.predicted_mean_staleness(240, 3) == pytest.approx(477 / 240)
    assert A.predicted_mean_staleness(3, 3) == pytest.approx(1.0)  # staleness 0, 1, 2
    with pytest.raises(ValueError):
        A.predicted_mean_staleness(2, 3)


def test_straggler_changes_nothing_in_sync_sgd(problem) -> None:
    slow = _launch(_sync, 2, problem, 4, (1, 4.0), 0.005)
    fast = _launch(_sync, 2, problem, 4)
    for a, b in zip(slow, fast, strict=True):
        assert torch.equal(a.params, b.params)
        assert a.gradients == b.gradients == 4


def test_argument_errors(problem) -> None:
    with pytest.raises(lk.RankError) as info:
        _launch(_server, 1, problem, 4)
    assert info.value.failures[0].exc_type == "ValueError"
    with pytest.raises(lk.RankError) as info:
        _launch(_server, 2, problem, 4, (0, 2.0))  # the server cannot straggle
    assert {f.exc_type for f in info.value.failures.values()} == {"ValueError"}
    with pytest.raises(lk.RankError):
        _launch(_local, 2, problem, 4, 0)


def _absent_worker(rank, world_size, problem):
    if rank == 1:
        time.sleep(5.0)  # never joins: the server must give up, not hang
        return None
    return A.parameter_server(problem, 4, timeout_s=1.0)


def test_a_missing_worker_times_out_instead_of_hanging(problem) -> None:
    with pytest.raises(lk.RankError) as info:
        _launch(_absent_worker, 2, problem)
    failure = info.value.failures[0]
    assert failure.exc_type == "RuntimeError"
    assert "did not complete" in failure.summary


def test_pace_sleeps_to_the_floor_times_the_slowdown() -> None:
    started = time.perf_counter()
    A.pace(started, 0.01, 3.0)
    assert time.perf_counter() - started >= 0.03  # a lower bound: sleep never returns early


def test_batches_depend_only_on_worker_and_step(problem) -> None:
    x1, y1 = problem.batch(1, 5)
    x2, y2 = problem.batch(1, 5)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert not torch.equal(problem.batch(2, 5)[0], x1)
    assert x1.shape == (problem.batch_size, 16)


def test_train_log_summaries() -> None:
    log = A.TrainLog("async", 0, 3, 2, initial_loss=2.0)
    assert log.updates_per_s == 0.0 and log.final_loss == 2.0
    log.wall_s, log.update, log.loss = [0.5, 1.0], [1, 2], [1.5, float("nan")]
    assert log.updates_per_s == 2.0
    assert log.final_loss == 1.5


def test_digits_problem_trains() -> None:
    digits = A.digits_problem(batch_size=32, lr=0.5)
    model = digits.model_fn()
    start = A.evaluate(model, A.initial_theta(model), digits)
    theta, losses = A.reference_sgd(digits, [[(0, k)] for k in range(30)])
    assert losses[-1] < 0.8 * start
    assert theta.numel() == lk.models.count_parameters(model)
