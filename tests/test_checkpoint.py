"""Tests for labkit/checkpoint: atomic files, markers, keep-last-K, RNG, sampler, TrainState."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DistributedSampler

from labkit import checkpoint as ckpt


def test_layout_is_per_rank_files_then_the_marker(tmp_path) -> None:
    path = ckpt.save(tmp_path, {"w": torch.arange(3)}, step=7)
    assert path == tmp_path / "step_000007"
    assert sorted(p.name for p in path.iterdir()) == ["COMPLETE", "rank_00000.pt"]
    meta = json.loads((path / "COMPLETE").read_text())
    assert meta == {"step": 7, "world_size": 1, "files": ["rank_00000.pt"]}
    assert torch.equal(ckpt.load(path)["w"], torch.arange(3))


def test_latest_ignores_a_folder_without_its_marker(tmp_path) -> None:
    assert ckpt.latest(tmp_path) is None
    ckpt.save(tmp_path, {"x": 1}, step=1)
    ckpt.save(tmp_path, {"x": 2}, step=2)
    (tmp_path / "step_000002" / "COMPLETE").unlink()  # as if killed before the commit
    assert ckpt.latest(tmp_path) == tmp_path / "step_000001"
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        ckpt.load(tmp_path / "step_000002")


def test_keep_last_k_and_debris_of_older_killed_saves_is_removed(tmp_path) -> None:
    ckpt.save(tmp_path, {"x": 0}, step=0)
    (tmp_path / "step_000001").mkdir()  # an older save killed before its marker
    for step in (2, 3, 4, 5):
        ckpt.save(tmp_path, {"x": step}, step=step, keep=2)
    assert [p.name for p in ckpt.checkpoints(tmp_path, complete_only=False)] == [
        "step_000004",
        "step_000005",
    ]
    assert ckpt.load(ckpt.latest(tmp_path))["x"] == 5


def test_a_newer_incomplete_save_is_left_alone(tmp_path) -> None:
    (tmp_path / "step_000009").mkdir()  # maybe still being written by other ranks
    ckpt.save(tmp_path, {"x": 1}, step=1, keep=1)
    assert (tmp_path / "step_000009").is_dir()
    assert ckpt.latest(tmp_path) == tmp_path / "step_000001"


def test_atomic_write_leaves_no_temporary_file(tmp_path) -> None:
    ckpt.atomic_write_bytes(tmp_path / "a.bin", b"old")
    ckpt.atomic_write_bytes(tmp_path / "a.bin", b"new")
    assert [p.name for p in tmp_path.iterdir()] == ["a.bin"]
    assert (tmp_path / "a.bin").read_bytes() == b"new"


def test_bad_arguments_are_refused(tmp_path) -> None:
    with pytest.raises(ValueError, match="keep >= 1"):
        ckpt.save(tmp_path, {}, step=1, keep=0)
    with pytest.raises(ValueError, match="unknown fault point"):
        ckpt.save(tmp_path, {}, step=1, fault="somewhere")


def test_rng_round_trip_through_a_file_replays_every_generator(tmp_path) -> None:
    torch.manual_seed(1)
    np.random.seed(2)
    random.seed(3)
    np.random.randn()  # leave a cached gaussian in numpy's state
    ckpt.save(tmp_path, {"rng": ckpt.capture_rng()}, step=0)
    first = (torch.rand(4), np.random.randn(4), [random.random() for _ in range(4)])
    torch.manual_seed(9)
    np.random.seed(9)
    random.seed(9)
    ckpt.restore_rng(ckpt.load(ckpt.latest(tmp_path))["rng"])
    again = (torch.rand(4), np.random.randn(4), [random.random() for _ in range(4)])
    assert torch.equal(first[0], again[0])
    assert np.array_equal(first[1], again[1])
    assert first[2] == again[2]


def test_sampler_resumes_mid_epoch_with_the_same_order() -> None:
    base = DistributedSampler(range(40), num_replicas=2, rank=1, shuffle=True, seed=5)
    full = ckpt.ResumableSampler(base, batch_size=4)
    full.set_epoch(3)
    order = list(full)
    other = ckpt.ResumableSampler(
        DistributedSampler(range(40), num_replicas=2, rank=1, shuffle=True, seed=5), 4
    )
    other.load_state_dict({"epoch": 3, "batches_done": 2})
    assert list(other) == order[8:]
    assert len(other) == 12
    other.set_epoch(4)  # a new epoch starts from its first batch
    assert other.state_dict() == {"epoch": 4, "batches_done": 0}
    assert len(list(other)) == 20


def test_train_state_round_trip_restores_everything(tmp_path) -> None:
    def build() -> ckpt.TrainState:
        model = nn.Linear(3, 2)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        sampler = ckpt.ResumableSampler(list(range(10)), batch_size=2)
        return ckpt.TrainState(model, opt, sched, sampler)

    torch.manual_seed(0)
    a = build()
    for _ in range(3):
        a.model(torch.randn(4, 3)).sum().backward()
        a.optimizer.step()
        a.scheduler.step()
        a.sampler.advance()
    ckpt.save(tmp_path, a.state_dict(3, extra={"loss": 0.5}), step=3)
    b = build()
    saved = ckpt.load(ckpt.latest(tmp_path))
    assert b.load_state_dict(saved) == 3
    assert saved["extra"] == {"loss": 0.5}
    for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(pa, pb)
        assert torch.equal(a.optimizer.state[pa]["exp_avg"], b.optimizer.state[pb]["exp_avg"])
    assert b.scheduler.get_last_lr() == a.scheduler.get_last_lr() == [0.1 * 0.5**3]
    assert b.sampler.state_dict() == {"epoch": 0, "batches_done": 3}
    no_sched = ckpt.TrainState(b.model, b.optimizer)
    with pytest.raises(ValueError, match="scheduler"):
        no_sched.load_state_dict(saved)


def test_loading_a_rank_the_checkpoint_does_not_have_points_to_dcp(tmp_path) -> None:
    path = ckpt.save(tmp_path, {"x": 1}, step=4)
    with pytest.raises(FileNotFoundError, match="written by 1 ranks.*save_sharded"):
        ckpt.load(path, rank=1)


def test_sleep_fault_before_the_marker_still_commits(tmp_path) -> None:
    path = ckpt.save(tmp_path, {"x": 1}, step=1, fault="before_marker:sleep=0")
    assert ckpt.is_complete(path)
    with pytest.raises(ValueError, match="unknown fault action"):
        ckpt.save(tmp_path, {"x": 1}, step=2, fault="before_marker:explode")
