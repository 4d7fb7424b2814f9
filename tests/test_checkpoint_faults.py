"""Fault-injection tests for labkit/checkpoint through ``lk.launch`` (2–4 CPU ranks, gloo).

- a rank SIGKILLed mid-run, relaunched and resumed, ends bit-identical to an uninterrupted run;
- a process SIGKILLed while a checkpoint is written leaves the previous one intact;
- a DCP checkpoint of an FSDP2 model written by 4 ranks loads into 2 (resharding);
- a rank that skips a collective makes ``lk.LaunchTimeout`` show every rank's stack.
"""

from __future__ import annotations

import pytest
import torch

import labkit as lk
from labkit import checkpoint as ckpt
from tests.checkpoint_cases import train

STEPS, EVERY, KILL_AT = 16, 5, 13  # epoch 0 has 11 steps: the resumed run crosses into epoch 1


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[dict]:
    return lk.launch(train, world_size=2, args=(str(tmp_path_factory.mktemp("a")), STEPS, EVERY))


def _kill_and_resume(directory: str, restore_rng: bool = True) -> list[dict]:
    with pytest.raises(lk.RankError) as info:
        lk.launch(train, world_size=2, args=(directory, STEPS, EVERY), kwargs={"kill_at": KILL_AT})
    assert info.value.failures[1].kind == "died"
    assert "SIGKILL" in str(info.value)
    assert ckpt.step_of(ckpt.latest(directory)) == 10  # work since step 10 is lost, no more
    return lk.launch(
        train, world_size=2, args=(directory, STEPS, EVERY), kwargs={"restore_rng": restore_rng}
    )


@pytest.mark.slow
def test_killed_and_resumed_run_is_bit_identical(uninterrupted, tmp_path) -> None:
    resumed = _kill_and_resume(str(tmp_path))
    assert [r["resumed_from"] for r in resumed] == [10, 10]
    assert [r["epoch"] for r in resumed] == [r["epoch"] for r in uninterrupted] == [1, 1]
    for rank in range(2):
        for name, value in uninterrupted[rank]["params"].items():
            assert torch.equal(resumed[rank]["params"][name], value), (rank, name)


@pytest.mark.slow
def test_resuming_without_the_rng_state_is_not_identical(uninterrupted, tmp_path) -> None:
    resumed = _kill_and_resume(str(tmp_path), restore_rng=False)  # dropout draws differ
    ref = uninterrupted[0]["params"]
    assert not all(torch.equal(resumed[0]["params"][k], v) for k, v in ref.items())


def _save_then_die(rank: int, world_size: int, directory: str, fault: str) -> None:
    ckpt.save(directory, {"w": torch.full((4,), 1.0 + rank)}, step=1)
    ckpt.save(directory, {"w": torch.full((4,), 2.0 + rank)}, step=2, fault=fault)


@pytest.mark.parametrize(
    ("fault", "victim", "left"),
    [
        ("mid_file", 1, {"rank_00000.pt", "rank_00001.pt.tmp"}),
        ("before_marker", 0, {"rank_00000.pt", "rank_00001.pt"}),
    ],
)
def test_kill_during_write_keeps_the_previous_checkpoint(tmp_path, fault, victim, left) -> None:
    def run(rank: int, world_size: int) -> None:
        _save_then_die(rank, world_size, str(tmp_path), fault if rank == victim else "")

    with pytest.raises(lk.RankError) as info:
        lk.launch(run, world_size=2, timeout=60)
    assert info.value.failures[victim].kind == "died"
    assert ckpt.latest(tmp_path) == tmp_path / "step_000001"
    assert {p.name for p in (tmp_path / "step_000002").iterdir()} == left
    for rank in range(2):
        assert torch.equal(
            ckpt.load(ckpt.latest(tmp_path), rank=rank)["w"], torch.full((4,), 1.0 + rank)
        )


def _fsdp_model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    model = lk.models.MLP(in_features=10, hidden=(6,), out_features=3, seed=0)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


def _full(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        if isinstance(v, dict):
            out[k] = _full(v)
        elif isinstance(v, torch.Tensor):
            out[k] = v.full_tensor() if hasattr(v, "full_tensor") else v.clone()
        else:
            out[k] = v
    return out


def test_dcp_checkpoint_of_4_ranks_loads_into_2(tmp_path) -> None:
    directory = str(tmp_path)

    def save4(rank: int, world_size: int) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, opt = _fsdp_model()
        x = torch.randn(4, 10, generator=torch.Generator().manual_seed(rank))
        model(x).sum().backward()
        opt.step()
        msd, osd = get_state_dict(model, opt)
        ckpt.save_sharded(directory, {"model": msd, "optim": osd, "step": 1}, step=1)
        return _full({"model": msd, "optim": osd["state"]})

    def load2(rank: int, world_size: int) -> tuple[dict, int, dict]:
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model, opt = _fsdp_model()
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "step": 0}
        ckpt.load_sharded(ckpt.latest(directory), state)
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        msd, osd = get_state_dict(model, opt)
        local = {k: tuple(v.to_local().shape) for k, v in model.state_dict().items()}
        return _full({"model": msd, "optim": osd["state"]}), state["step"], local

    saved = lk.launch(save4, world_size=4)
    assert ckpt.saved_world_size(ckpt.latest(directory)) == 4
    loaded = lk.launch(load2, world_size=2)
    assert loaded[1][2]["net.0.weight"] == (3, 10)  # 6 rows: 3 per rank now, not 2 of 4 ranks
    for full, step, _ in loaded:
        assert step == 1
        for name, value in saved[0]["model"].items():
            assert torch.equal(full["model"][name], value), name
        for name, st in saved[0]["optim"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(full["optim"][name][key], st[key]), (name, key)


def test_a_skipped_collective_times_out_with_every_ranks_stack() -> None:
    def skip(rank: int, world_size: int) -> None:
        import torch.distributed as dist

        t = torch.ones(3)
        if rank == 0:
            dist.all_reduce(t)  # rank 1 never joins this one ...
        else:
            dist.recv(t, src=0)  # ... and waits for a message rank 0 never sends

    with pytest.raises(lk.LaunchTimeout) as info:
        lk.launch(skip, world_size=2, timeout=3)
    text = str(info.value)
    assert set(info.value.failures) == {0, 1}
    assert all(f.kind == "stuck" for f in info.value.failures.values())
    assert "--- rank 0 (stuck) ---" in text and "--- rank 1 (stuck) ---" in text
    assert "dist.all_reduce(t)" in info.value.failures[0].stack
    assert "dist.recv(t, src=0)" in info.value.failures[1].stack
