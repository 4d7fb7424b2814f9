"""The step-time model counts what labkit's implementations do: every strategy, recorded."""

from __future__ import annotations

import collections

import torch

import labkit as lk
from labkit.plan_time import collective_counts
from labkit.plan_workload import transformer_workload

cap = lk.capstone
CONFIG = dict(dim=16, n_layers=2, n_heads=2, seq_len=8, batch=8, max_norm=0.5)
RECORDED_AS = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "send": "send",
    "recv": "recv",
}


def _counted(rank: int, world_size: int, names: list[str]) -> dict[str, dict[str, int]]:
    """Per strategy, this rank's collectives of its second step (the first one warms up)."""
    recording = lk.backends.recording
    config = cap.RunConfig(**CONFIG)
    vocab = lk.data.char_corpus().vocab_size
    out = {}
    for name in names:
        s = cap.Strategy.parse(name, world_size, microbatches=2)
        mesh = lk.mesh.build_mesh(s.dims)
        parts = cap.parallelize_gpt(cap.build_model(config, vocab), s, mesh, 8, config.lr)
        opt = parts.make_adam()
        schedule = cap.make_schedule(opt, config)
        x, y = cap.global_batch(lk.data.char_corpus(), config, 0)
        xb, yb = (lk.mesh.dp_shard(t, s.dims, mesh) for t in (x, y))
        m = s.microbatches if s.pp == 1 else 1
        context = cap.autocast_context(config, torch.device("cpu"))
        for _ in range(2):
            torch.distributed.barrier()
            recording.clear()
            cap.train_step(
                parts,
                opt,
                schedule,
                xb,
                yb,
                config,
                m,
                context,
            )
        ops = collections.Counter(RECORDED_AS.get(r.op, r.op) for r in recording.records())
        ops.pop("barrier", None)
        out[name] = dict(ops)
    return out


def _expected(name: str, world_size: int, vocab: int) -> dict[str, int]:
    s = cap.Strategy.parse(name, world_size, microbatches=2)
    c = cap.RunConfig(**CONFIG)
    work = transformer_workload(vocab, c.dim, c.n_layers, c.seq_len, c.batch, flops=1.0)
    counts = collective_counts(work, s.dims, s.zero_stage, s.microbatches)
    return {k: v for k, v in counts.items() if v}


def _check(world_size: int, names: list[str]) -> None:
    spec = lk.backends.recording.spec("gloo")
    got = lk.launch(_counted, world_size, backend=spec, args=(names,), timeout=300)[0]
    vocab = lk.data.char_corpus().vocab_size
    for name in names:
        assert got[name] == _expected(name, world_size, vocab), name


def test_two_ranks_every_strategy():
    _check(2, ["dp", "zero1", "zero2", "zero3", "fsdp", "pp", "tp"])


def test_four_ranks_two_dimensional():
    _check(4, ["dp_tp", "fsdp_tp", "dp_pp"])
