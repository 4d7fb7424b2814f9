"""FSDP2's schedule settings change when parameters are gathered, never what a step computes.

Notebook 13, section 5: ``reshard_after_forward`` (free the gathered parameters after forward,
or keep them until backward), explicit forward and backward prefetch
(``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``) and the
asynchronous prefetch (``_set_unshard_async_op``), on 2 ranks; ``reshard_after_forward=2``
(keep a shard over 2 of 4 ranks between forward and backward) on 4. Under every setting each
rank's outputs and every gradient equal one process's on the concatenated batch, step after
step, and the recording backend counts the all-gathers each setting issues in backward and
over how many ranks.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import labkit as lk
from labkit.backends import recording

STEPS = 2
BATCH = 3  # per rank
LR = 0.1
WIDTHS = (7, 10, 9, 3)  # rows of 10, 9 and 3: FSDP2 pads 2 of the 3 on 2 ranks, all on 4
AG = "all_gather_into_tensor"
# FSDP2 averages gradients in its reduce-scatter (a sum of rank means over the world size),
# one process takes the mean over the concatenated batch: the same numbers summed in another
# order. Measured at most 3e-8 apart on 2 ranks, 6e-8 on 4, over two steps (outputs,
# gradients, parameters).
TOL = dict(rtol=1e-5, atol=1e-6)
CASES = [  # (world size, setting)
    (2, "reshard_after_forward=True"),
    (2, "reshard_after_forward=False"),
    (2, "forward prefetch"),
    (2, "backward prefetch, 2 ahead"),
    (2, "asynchronous prefetch"),
    (4, "reshard_after_forward=2"),  # an integer needs a divisor 1 < k < N_d
]


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = zip(WIDTHS[:-1], WIDTHS[1:], strict=True)
    return torch.nn.Sequential(
        *[torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.Tanh()) for a, b in layers]
    )


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(BATCH, WIDTHS[0], generator=g)
    return x, torch.randint(0, WIDTHS[-1], (BATCH,), generator=g)


def _shard(setting: str) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    model = _model()
    reshard = {"reshard_after_forward=False": False, "reshard_after_forward=2": 2}.get(
        setting, True
    )
    for block in model:
        fully_shard(block, reshard_after_forward=reshard)
    fully_shard(model, reshard_after_forward=reshard)
    blocks = list(model)
    if setting in ("forward prefetch", "asynchronous prefetch"):
        for block, after in zip(blocks[:-1], blocks[1:], strict=True):
            block.set_modules_to_forward_prefetch([after])
    if setting == "backward prefetch, 2 ahead":
        blocks[2].set_modules_to_backward_prefetch([blocks[1], blocks[0]])
    if setting == "asynchronous prefetch":
        model._set_unshard_async_op(True)  # private in torch 2.13, as notebook 13 says
    return model


def _train(rank: int, world_size: int, settings: list[str]) -> dict:
    out = {}
    for setting in settings:
        model = _shard(setting)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        steps = []
        for step in range(STEPS):
            x, y = _batch(step, rank)
            recording.clear()
            logits = model(x)
            n_forward = len(recording.records())
            F.cross_entropy(logits, y).backward()
            backward = recording.records()[n_forward:]
            grads = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
            steps.append(
                {
                    "logits": logits.detach(),
                    "grads": grads,
                    "backward_all_gathers": [len(r.participants) for r in backward if r.op == AG],
                }
            )
            opt.step()
            opt.zero_grad()
        params = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
        out[setting] = {"steps": steps, "params": params}
    return out


def _reference(world_size: int) -> tuple[list[dict], dict[str, torch.Tensor]]:
    """SGD on one process over every rank's batch: logits and gradients per step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    steps = []
    for step in range(STEPS):
        xs, ys = zip(*(_batch(step, r) for r in range(world_size)), strict=True)
        opt.zero_grad()
        logits = model(torch.cat(xs))
        F.cross_entropy(logits, torch.cat(ys)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        steps.append({"logits": logits.detach().split(BATCH), "grads": grads})
        opt.step()
    return steps, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def runs() -> dict[int, list[dict]]:
    """Every rank's results per world size: one launch for each."""
    worlds = sorted({w for w, _ in CASES})
    return {
        w: lk.launch(
            _train,
            w,
            backend=recording.spec("gloo"),
            args=([s for v, s in CASES if v == w],),
            timeout=120,
        )
        for w in worlds
    }


@pytest.mark.parametrize("world_size, setting", CASES)
def test_outputs_and_every_gradient_equal_one_process(runs, world_size, setting):
    ref_steps, ref_params = _reference(world_size)
    for rank, out in enumerate(runs[world_size]):
        for step, (got, want) in enumerate(zip(out[setting]["steps"], ref_steps, strict=True)):
            torch.testing.assert_close(got["logits"], want["logits"][rank], **TOL)
            assert got["grads"].keys() == want["grads"].keys()
            for name, grad in want["grads"].items():
                torch.testing.assert_close(
                    got["grads"][name],
                    grad,
                    **TOL,
                    msg=lambda m, r=rank, s=step, n=name: f"rank {r}, step {s}, {n}: {m}",
                )
        for name, p in ref_params.items():
            torch.testing.assert_close(out[setting]["params"][name], p, **TOL)


@pytest.mark.parametrize("world_size, setting", CASES)
def test_backwards_all_gathers_follow_reshard_after_forward(runs, world_size, setting):
    # True (prefetched or not): each block freed after forward is gathered again over all
    # ranks; False keeps all three gathered until backward; 2 gathers them from 2 ranks' shards.
    blocks = len(WIDTHS) - 1
    want = {"reshard_after_forward=False": [], "reshard_after_forward=2": [2] * blocks}
    want = want.get(setting, [world_size] * blocks)
    for out in runs[world_size]:
        assert [s["backward_all_gathers"] for s in out[setting]["steps"]] == [want] * STEPS
