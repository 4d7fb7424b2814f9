"""FSDP2's schedule settings change when parameters are gathered, never what a step computes.

Notebook 13, section 5: ``reshard_after_forward`` (free the gathered parameters after forward,
or keep them until backward), explicit forward and backward prefetch
(``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``) and the
asynchronous prefetch (``_set_unshard_async_op``). Under every setting each rank's outputs and
every gradient equal one process's on the concatenated batch, step after step, and the
recording backend counts the all-gathers each setting issues in backward.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import labkit as lk
from labkit.backends import recording

WORLD = 2
STEPS = 2
BATCH = 3  # per rank
LR = 0.1
WIDTHS = (7, 10, 9, 3)  # rows of 10, 9 and 3: odd, so FSDP2 pads two of the three shards
AG = "all_gather_into_tensor"
# FSDP2 averages gradients in its reduce-scatter (a sum of rank means divided by 2), one
# process takes the mean over the concatenated batch: the same numbers summed in another
# order. Measured at most 3e-8 apart over two steps (outputs, gradients, parameters).
TOL = dict(rtol=1e-5, atol=1e-6)
SETTINGS = (
    "reshard_after_forward=True",
    "reshard_after_forward=False",
    "forward prefetch",
    "backward prefetch, 2 ahead",
    "asynchronous prefetch",
)


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
    reshard = setting != "reshard_after_forward=False"
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


def _train(rank: int, world_size: int) -> dict:
    out = {}
    for setting in SETTINGS:
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
                    "backward_all_gathers": sum(r.op == AG for r in backward),
                }
            )
            opt.step()
            opt.zero_grad()
        params = {n: p.full_tensor().detach() for n, p in model.named_parameters()}
        out[setting] = {"steps": steps, "params": params}
    return out


def _reference() -> tuple[list[dict], dict[str, torch.Tensor]]:
    """SGD on one process over every rank's batch: logits and gradients per step."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    steps = []
    for step in range(STEPS):
        xs, ys = zip(*(_batch(step, r) for r in range(WORLD)), strict=True)
        opt.zero_grad()
        logits = model(torch.cat(xs))
        F.cross_entropy(logits, torch.cat(ys)).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        steps.append({"logits": logits.detach().split(BATCH), "grads": grads})
        opt.step()
    return steps, {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return lk.launch(_train, WORLD, backend=recording.spec("gloo"), timeout=120)


@pytest.mark.parametrize("setting", SETTINGS)
def test_outputs_and_every_gradient_equal_one_process(runs, setting):
    ref_steps, ref_params = _reference()
    for rank, out in enumerate(runs):
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


@pytest.mark.parametrize("setting", SETTINGS)
def test_only_reshard_after_forward_false_skips_backwards_all_gathers(runs, setting):
    # Every block was freed after forward and is gathered again in backward, prefetched or
    # not; False keeps all three gathered from forward to backward.
    want = 0 if setting == "reshard_after_forward=False" else len(WIDTHS) - 1
    for out in runs:
        assert [s["backward_all_gathers"] for s in out[setting]["steps"]] == [want] * STEPS
