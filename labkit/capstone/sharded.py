"""The setups that split the model: ZeRO-1/2/3, FSDP2, tensor and pipeline parallelism.

Introduced in notebooks/17_capstone.ipynb (see ``labkit.capstone.setups``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from labkit.capstone.setups import (
    RankSetup,
    average_grads,
    evaluator,
    gpt_stages,
    lm_loss,
    plain_step,
    state_bytes,
)
from labkit.models import TinyGPT

if TYPE_CHECKING:
    from labkit.capstone.setups import Groups
    from labkit.capstone.strategy import Strategy

__all__ = ["fsdp_setup", "pipeline_setup", "tensor_setup", "zero_setup"]


def _breakdown(b) -> dict[str, int]:
    d = asdict(b)
    return {k: int(d[f"{k}_bytes"]) for k in ("params", "grads", "optimizer")}


def zero_setup(s: Strategy, groups: Groups, make_model: Callable[[], TinyGPT], lr: float):
    """ZeRO stage ``s.zero_stage`` over the data-parallel group (``lk.parallel.zero``).

    Introduced in notebooks/17_capstone.ipynb.
    """
    from labkit.parallel.zero import ZeroOptimizer

    model = make_model()
    opt = ZeroOptimizer(model, s.zero_stage, group=groups.dp, lr=lr)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item()

    return RankSetup(
        step, evaluator(model), lambda: _breakdown(opt.rank_bytes()), opt.full_parameters
    )


def fsdp_setup(groups: Groups, make_model: Callable[[], TinyGPT], lr: float) -> RankSetup:
    """PyTorch FSDP2 over the data-parallel group, one ``fully_shard`` unit per layer.

    Introduced in notebooks/17_capstone.ipynb.
    """
    from labkit.parallel.zero import apply_fully_shard, fsdp_rank_bytes

    # FSDP2 warns when a wrapped Linear returns a view (a 3-D input's output is one): an
    # in-place op on it would skip a hook. TinyGPT's residual adds are out of place.
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
    model = apply_fully_shard(make_model(), groups.dp)
    opt = torch.optim.Adam(model.parameters(), lr=lr)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        opt.zero_grad(set_to_none=False)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    def full_state() -> dict[str, torch.Tensor]:
        return {k: v.full_tensor().detach().clone() for k, v in model.named_parameters()}

    return RankSetup(
        step, evaluator(model), lambda: _breakdown(fsdp_rank_bytes(model, opt)), full_state
    )


def tensor_setup(
    s: Strategy, groups: Groups, make_model: Callable[[], TinyGPT], lr: float
) -> RankSetup:
    """Megatron-style tensor parallelism of every block (heads and MLP split over tp ranks);
    embeddings, LayerNorms and the head replicated.

    Introduced in notebooks/17_capstone.ipynb.
    """
    from labkit.parallel.tensor import (
        ColumnParallelLinear,
        RowParallelLinear,
        apply_tensor_parallel,
        block_plan,
    )

    model = make_model()
    plan: dict[str, str] = {}
    for i in range(1, model.n_layers + 1):
        plan |= block_plan(f"{i}.attn", f"{i}.mlp")
    apply_tensor_parallel(model, plan, groups.tp)
    params = list(model.parameters())
    opt = torch.optim.Adam(params, lr=lr)

    def gather(t: torch.Tensor, dim: int) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(groups.tp))]
        dist.all_gather(parts, t.detach().contiguous(), group=groups.tp)
        return torch.cat(parts, dim)

    def full_state() -> dict[str, torch.Tensor]:
        out = {}
        for mname, mod in model.named_modules():
            for pname, p in mod.named_parameters(recurse=False):
                dim = 0 if isinstance(mod, ColumnParallelLinear) else None
                if isinstance(mod, RowParallelLinear) and pname == "weight":
                    dim = 1
                full = p.detach().clone() if dim is None else gather(p, dim)
                out[f"{mname}.{pname}" if mname else pname] = full
        return out

    step = plain_step(model, params, opt, groups, s.dp)
    return RankSetup(step, evaluator(model), lambda: state_bytes(params, opt), full_state)


def pipeline_setup(
    s: Strategy, groups: Groups, make_model: Callable[[], TinyGPT], lr: float
) -> RankSetup:
    """A 1F1B pipeline of ``s.pp`` stages (``lk.parallel.pipeline.run_schedule``); this rank
    keeps only its stage.

    Introduced in notebooks/17_capstone.ipynb.
    """
    from labkit.parallel.pipeline import one_f_one_b, run_schedule

    model = make_model()
    dim, vocab = model.dim, model.vocab_size
    stages = gpt_stages(model, s.pp)
    me, last = groups.pp_rank, s.pp - 1
    first_layer = sum(len(st) for st in stages[:me])  # global index of this stage's layer 0
    stage = stages[me]
    del model, stages  # the other stages' layers are freed: this rank holds one stage
    params = list(stage.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    schedule = one_f_one_b(s.pp, s.microbatches)

    def step(x: torch.Tensor, y: torch.Tensor) -> float | None:
        opt.zero_grad(set_to_none=False)
        m = s.microbatches
        b, T = x.shape[0] // m, x.shape[1]  # micro-batch, time
        shapes = [(b, T, dim)] * last + [(b, T, vocab)]
        # Token ids travel as floats: the runtime's receive buffers take the input's dtype.
        xs, ys = list(x.float().chunk(m)), list(y.chunk(m))
        result = run_schedule(schedule, {me: stage}, xs, ys, lm_loss, shapes, group=groups.pp)
        average_grads(params, groups.dp, s.dp)
        opt.step()
        return result.loss if me == last else None

    @torch.no_grad()
    def evaluate(x: torch.Tensor, y: torch.Tensor) -> float | None:
        h = x.float()
        if me > 0:
            h = torch.empty(x.shape[0], x.shape[1], dim)
            dist.recv(h, group=groups.pp, group_src=me - 1)
        out = stage(h)
        if me == last:
            return lm_loss(out, y).item()
        dist.send(out.contiguous(), group=groups.pp, group_dst=me + 1)
        return None

    def full_state() -> dict[str, torch.Tensor]:
        mine = {}
        for name, p in stage.named_parameters():
            local, _, rest = name.partition(".")
            mine[f"{first_layer + int(local)}.{rest}"] = p.detach().clone()
        parts: list[dict[str, torch.Tensor] | None] = [None] * s.pp
        dist.all_gather_object(parts, mine, group=groups.pp)
        return {k: v for part in parts for k, v in part.items()}

    return RankSetup(step, evaluate, lambda: state_bytes(params, opt), full_state)
