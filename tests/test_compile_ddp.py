"""A ``torch.compile``'d model under DDP computes what eager DDP and one process compute.

Notebook 20, section 6: ``DDP(torch.compile(model))``. TorchDynamo's DDPOptimizer splits the
captured graph where DDP's buckets end (here one graph per 1 MiB bucket, as notebook 20
counts), so that the all-reduces stay outside the graphs and overlap backward. Splitting must
not change the step: each rank's outputs and every gradient equal eager DDP's and one
process's on the concatenated batch, for a backend that runs the captured graphs as they are
(``eager``) and one that derives their backward with AOTAutograd (``aot_eager``).
"""

from __future__ import annotations

import pytest
import torch

import labkit as lk

WORLD = 2
STEPS = 2
BATCH = 4  # per rank
WIDTH = 512  # a bias-free 512 × 512 float32 weight is exactly 1 MiB
DEPTH = 4
CAP_MB = 1.0  # a bucket per layer, and a graph per bucket
LR = 0.01
# DDP averages the ranks' gradients (a sum divided by 2) where one process takes the mean over
# the concatenated batch: float32 sums in another order (measured at most 3e-8 apart, for
# gradients up to 5e-2). Neither backend generates code, so the compiled graphs run eager's
# kernels in eager's order: compiled DDP equals eager DDP bit for bit (measured).
TOL = dict(rtol=1e-5, atol=1e-7)
EXACT = dict(rtol=0, atol=0)
BACKENDS = ("eager", "aot_eager")


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    layers = [(torch.nn.Linear(WIDTH, WIDTH, bias=False), torch.nn.ReLU()) for _ in range(DEPTH)]
    return torch.nn.Sequential(*[m for pair in layers for m in pair])


def _loss(y: torch.Tensor) -> torch.Tensor:
    return y.square().sum(dim=1).mean()  # a mean over samples, so DDP's average is the batch's


def _batch(step: int, rank: int) -> torch.Tensor:
    return torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(10 * step + rank))


def _train(rank: int, world_size: int, backend: str) -> dict:
    import torch._dynamo
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch._dynamo.reset()
    graphs: list[int] = []

    def counting(gm, example_inputs):
        ops = ("call_function", "call_module", "call_method")
        graphs.append(sum(n.op in ops for n in gm.graph.nodes) // 2)  # a Linear and a ReLU each
        return torch._dynamo.lookup_backend(backend)(gm, example_inputs)

    models = {
        "eager DDP": DDP(_model(), bucket_cap_mb=CAP_MB),
        "compiled DDP": DDP(torch.compile(_model(), backend=counting), bucket_cap_mb=CAP_MB),
    }
    out = {name: {"outputs": [], "grads": []} for name in models}
    for name, model in models.items():
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        for step in range(STEPS):
            y = model(_batch(step, rank))
            _loss(y).backward()
            out[name]["outputs"].append(y.detach())
            out[name]["grads"].append([p.grad.clone() for p in model.parameters()])
            opt.step()
            opt.zero_grad()
    out["graphs"] = graphs
    return out


def _reference() -> dict:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    out = {"outputs": [], "grads": []}
    for step in range(STEPS):
        y = model(torch.cat([_batch(step, r) for r in range(WORLD)]))
        _loss(y).backward()
        out["outputs"].append(y.detach().split(BATCH))
        out["grads"].append([p.grad.clone() for p in model.parameters()])
        opt.step()
        opt.zero_grad()
    return out


@pytest.fixture(scope="module", params=BACKENDS)
def runs(request) -> list[dict]:
    return lk.launch(_train, WORLD, backend="gloo", args=(request.param,), timeout=120)


def test_ddpoptimizer_compiles_one_graph_per_bucket(runs):
    # Four graphs of one layer each, compiled in the first step and reused in the second.
    for out in runs:
        assert out["graphs"] == [1] * DEPTH


def test_compiled_ddp_equals_eager_ddp_bit_for_bit(runs):
    for out in runs:
        for step in range(STEPS):
            eager, compiled = out["eager DDP"], out["compiled DDP"]
            torch.testing.assert_close(compiled["outputs"][step], eager["outputs"][step], **EXACT)
            for got, want in zip(compiled["grads"][step], eager["grads"][step], strict=True):
                torch.testing.assert_close(got, want, **EXACT)


def test_compiled_ddp_equals_eager_ddp_and_one_process(runs):
    ref = _reference()
    for rank, out in enumerate(runs):
        for step in range(STEPS):
            want_y = ref["outputs"][step][rank]
            for name in ("eager DDP", "compiled DDP"):
                torch.testing.assert_close(out[name]["outputs"][step], want_y, **TOL)
                pairs = zip(out[name]["grads"][step], ref["grads"][step], strict=True)
                for i, (got, want) in enumerate(pairs):
                    torch.testing.assert_close(
                        got,
                        want,
                        **TOL,
                        msg=lambda m, w=name, r=rank, s=step, i=i: (
                            f"{w}, rank {r}, step {s}, weight {i}: {m}"
                        ),
                    )
