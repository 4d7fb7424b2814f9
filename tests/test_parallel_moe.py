"""Tests for labkit/parallel/moe/ and labkit/costmodel/moe.py: the router's capacity, drops and
auxiliary loss by hand; dispatch/combine over 2 and 4 ranks equal to one process (outputs, every
gradient, the aux loss, the dropped tokens) with all-to-all bytes counted against the routing;
EP × DP on 4 ranks equal to one process."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

import labkit as lk
from labkit.costmodel import expert_capacity, moe_all_to_all_bytes, uniform_tokens_sent
from labkit.parallel import moe
from labkit.parallel.dims import ParallelDims

TOL = {"rtol": 1e-5, "atol": 1e-6}  # float32: experts see their rows in another grouping
T, D, D_FF = 16, 8, 16  # tokens per rank, model width, expert width

# ------------------------------------------------------------------- arithmetic, no processes


def test_expert_capacity_follows_switch_and_gshard() -> None:
    assert expert_capacity(16, 4, top_k=1, capacity_factor=1.25) == 5  # Switch: T/E · f
    assert expert_capacity(16, 4, top_k=2, capacity_factor=1.0) == 8  # GShard: 2T/E
    assert expert_capacity(10, 4, top_k=1, capacity_factor=1.0) == 3  # ceil(2.5)
    assert expert_capacity(16, 4, top_k=1, capacity_factor=None) == 16  # nothing dropped
    assert expert_capacity(16, 4, top_k=1, capacity_factor=100.0) == 16  # never above T
    for bad in [(16, 4, 5, 1.0), (16, 0, 1, 1.0), (16, 4, 1, 0.0), (-1, 4, 1, 1.0)]:
        with pytest.raises(ValueError):
            expert_capacity(*bad)


def test_all_to_all_bytes_and_uniform_expectation() -> None:
    assert moe_all_to_all_bytes(10, 7, d_model=8, n_experts=4) == [32, 320, 224, 320, 224]
    assert moe_all_to_all_bytes(10, 7, 8, 4, backward=False) == [32, 320, 224]
    assert moe_all_to_all_bytes(1, 1, 8, 4, element_size=2) == [32, 16, 16, 16, 16]
    assert uniform_tokens_sent(16, 2, 4) == (32.0, 24.0)
    assert uniform_tokens_sent(16, 1, 1) == (16.0, 0.0)


def test_expert_groups_split_dp_into_ep_and_expert_dp() -> None:
    assert ParallelDims(dp=4).expert_groups(2) == ([[0, 1], [2, 3]], [[0, 2], [1, 3]])
    assert ParallelDims(dp=4).expert_groups(4) == ([[0, 1, 2, 3]], [[0], [1], [2], [3]])
    assert ParallelDims(dp=2, tp=2).expert_groups(2) == ([[0, 2], [1, 3]], [[0], [1], [2], [3]])
    with pytest.raises(ValueError, match="dividing dp"):
        ParallelDims(dp=4).expert_groups(3)


def test_top1_keeps_the_gate_probability_and_top2_renormalises() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0], [0.0, 0.5, 3.0, 0.1]])
    p = logits.softmax(-1)
    r1 = moe.route(logits, top_k=1, capacity=2)  # Switch: y = p_i(x) E_i(x)
    assert r1.experts.tolist() == [[0], [2]]
    torch.testing.assert_close(r1.weights[:, 0], p.max(-1).values)
    r2 = moe.route(logits, top_k=2, capacity=2)  # GShard: g1, g2 = p1, p2 / (p1 + p2)
    assert r2.experts.tolist() == [[0, 1], [2, 1]]
    torch.testing.assert_close(r2.weights.sum(-1), torch.ones(2))
    torch.testing.assert_close(r2.weights[0, 0], p[0, 0] / (p[0, 0] + p[0, 1]))
    r2raw = moe.route(logits, top_k=2, capacity=2, normalize=False)
    torch.testing.assert_close(r2raw.weights, p.topk(2).values)


def test_capacity_drops_later_tokens_and_second_choices_first() -> None:
    # tokens 0..4 all prefer expert 0; tokens 0, 1 have expert 1 second, 2..4 expert 2 second
    logits = torch.tensor([[3.0, 2.0, 0.0, 0.0]] * 2 + [[3.0, 0.0, 2.0, 0.0]] * 3)
    logits[3:, 1] = 2.5  # tokens 3, 4: first choice 0, second choice 1
    r = moe.route(logits, top_k=2, capacity=2)
    assert r.experts[:, 0].tolist() == [0] * 5
    assert r.kept[:, 0].tolist() == [True, True, False, False, False]  # token order
    # expert 1's second choices come from tokens 0, 1, 3, 4: the first two fit
    assert r.experts[:, 1].tolist() == [1, 1, 2, 1, 1]
    assert r.kept[:, 1].tolist() == [True, True, True, False, False]
    assert r.position.tolist() == [[0, 0], [1, 1], [2, 0], [3, 2], [4, 3]]
    assert r.tokens_per_expert().tolist() == [2, 2, 1, 0]
    tokens, choices, counts = moe.dispatch_order(r)
    assert list(zip(tokens.tolist(), choices.tolist(), strict=True)) == [
        (0, 0), (1, 0), (0, 1), (1, 1), (2, 1)
    ]  # fmt: skip
    assert counts.tolist() == [2, 2, 1, 0]


def test_load_balancing_loss_is_one_when_balanced_and_n_when_collapsed() -> None:
    E = 4
    uniform = torch.full((8, E), 1 / E)
    experts = torch.arange(8).remainder(E)[:, None]  # f_i = 1/4 each
    assert moe.load_balancing_loss(uniform, experts).item() == pytest.approx(1.0)
    collapsed = torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 8)
    assert moe.load_balancing_loss(collapsed, torch.zeros(8, 1, dtype=torch.long)).item() == E
    # gradient through P only: dL/dp_ti = N · f_i / T
    p = torch.rand(8, E).softmax(-1).requires_grad_()
    e = p.argmax(-1, keepdim=True)
    moe.load_balancing_loss(p, e).backward()
    f = torch.bincount(e[:, 0], minlength=E).float() / 8
    torch.testing.assert_close(p.grad, (E * f / 8).expand(8, E))
    empty = moe.load_balancing_loss(torch.zeros(0, E), torch.zeros(0, 1, dtype=torch.long))
    assert empty.item() == 0.0  # a rank without tokens adds nothing (not NaN)


def test_switch_top1_needs_the_raw_probability_for_the_router_to_learn() -> None:
    """Renormalising one weight makes it 1: the task loss no longer reaches the router."""
    grads = {}
    for normalize in (False, True):
        layer = moe.MoELayer(D, 4, D_FF, top_k=1, capacity_factor=None, normalize=normalize)
        layer(torch.randn(T, D, generator=torch.Generator().manual_seed(0))).sum().backward()
        grads[normalize] = layer.router.gate.weight.grad
    assert grads[False].abs().max() > 1e-3
    assert grads[True].abs().max() < 1e-6  # p/p = 1: zero up to rounding


def _naive_moe(layer: moe.MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Token by token: Σ over its kept choices of weight × expert(token)."""
    r = layer.router(x)
    rows = []
    for t in range(x.shape[0]):
        y = torch.zeros(x.shape[1])
        for j in range(r.experts.shape[1]):
            if r.kept[t, j]:
                y = y + r.weights[t, j] * layer.experts[int(r.experts[t, j])](x[t : t + 1])[0]
        rows.append(y)
    return torch.stack(rows)


@pytest.mark.parametrize(("top_k", "cf"), [(1, 1.0), (2, 1.0), (2, 0.5), (1, None)])
def test_moe_layer_equals_a_token_by_token_loop(top_k, cf) -> None:
    layer = moe.MoELayer(D, 4, D_FF, top_k=top_k, capacity_factor=cf, seed=2)
    x = torch.randn(2 * T, D, generator=torch.Generator().manual_seed(3))
    y = layer(x, n_groups=2)
    want = torch.cat([_naive_moe(layer, xg) for xg in x.chunk(2)])
    torch.testing.assert_close(y, want, **TOL)
    assert len(layer.routing) == 2 and all(r.capacity == expert_capacity(T, 4, top_k, cf)
                                           for r in layer.routing)  # fmt: skip
    aux = [moe.load_balancing_loss(r.probs, r.experts) for r in layer.routing]
    torch.testing.assert_close(layer.aux_loss, torch.stack(aux).mean())
    with pytest.raises(ValueError, match="equal groups"):
        layer(x, n_groups=3)


# ---------------------------------------------------------- dispatch/combine on real ranks

# (top_k, capacity factor, all-to-all implementation, skewed router) per world size
CASES = {
    2: [(1, 1.0, "collective", False), (2, 1.0, "p2p", False), (2, None, "torch", False),
        (1, 1.0, "collective", True)],
    4: [(2, 1.0, "collective", False), (1, 0.5, "p2p", True)],
}  # fmt: skip
EXPERTS = {2: 4, 4: 8}


def _case_data(world_size: int, skew: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    x, grad_out = (
        torch.randn(world_size * T, D, generator=g),
        torch.randn(world_size * T, D, generator=g),
    )
    if skew:  # rank 0's tokens all prefer expert 0, its own: nothing to send to its peers
        x[:T, 0] = x[:T, 0].abs() + 1.0
    return x, grad_out


def _case_layer(world_size: int, top_k: int, cf: float | None, skew: bool) -> moe.MoELayer:
    layer = moe.MoELayer(D, EXPERTS[world_size], D_FF, top_k=top_k, capacity_factor=cf, seed=7)
    if skew:
        with torch.no_grad():
            layer.router.gate.weight[0, 0] += 20.0
    return layer


def _loss(y: torch.Tensor, grad_out: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
    return (y * grad_out).sum() + 0.1 * aux


def _dispatch_case(rank: int, world_size: int, top_k, cf, impl, skew) -> dict:
    from labkit.backends import recording

    x, grad_out = _case_data(world_size, skew)
    layer = _case_layer(world_size, top_k, cf, skew)
    ep = moe.ExpertParallelMoE(layer, None, impl)
    mine = x.chunk(world_size)[rank].clone().requires_grad_()
    recording.clear()
    y = ep(mine)
    _loss(y, grad_out.chunk(world_size)[rank], ep.aux_loss).backward()
    ops = [(r.op, r.n_bytes, r.dtype, r.peer) for r in recording.records()]
    dist.barrier()
    return {
        "y": y.detach(), "x_grad": mine.grad, "aux": ep.aux_loss.detach(), "kept": ep.routing.kept,
        "experts": ep.routing.experts, "received": ep.received, "ops": ops,
        "grads": {n: p.grad for n, p in layer.named_parameters() if p.grad is not None},
        "local": list(range(ep.first_expert, ep.first_expert + ep.n_local)),
    }  # fmt: skip


class _Net(nn.Module):
    """in_proj → h + MoE(h) (dropped tokens pass through) → head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.in_proj, self.head = nn.Linear(6, D), nn.Linear(D, 3)
        self.moe = moe.MoELayer(D, 4, D_FF, top_k=2, capacity_factor=1.0, seed=9)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.in_proj(x)
        return self.head(h + self.moe(h))


def _ep_dp_data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return torch.randn(4 * T, 6, generator=g), torch.randint(0, 3, (4 * T,), generator=g)


ALPHA = 0.01  # Switch's aux-loss coefficient


def _ep_dp_case(rank: int, world_size: int) -> dict:
    from labkit.backends import recording

    ep_groups, edp_groups = ParallelDims(dp=4).expert_groups(2)
    groups = {tuple(g): dist.new_group(g) for g in ep_groups + edp_groups}  # all ranks, in order
    ep = groups[tuple(next(g for g in ep_groups if rank in g))]
    edp = groups[tuple(next(g for g in edp_groups if rank in g))]
    model = _Net()
    names = {id(p): n for n, p in model.named_parameters()}  # names in the whole model
    moe.apply_ep(model, ep)
    x, y = (t.chunk(4)[rank] for t in _ep_dp_data())
    recording.clear()
    loss = F.cross_entropy(model(x), y) + ALPHA * model.moe.aux_loss
    loss.backward()
    moe.reduce_ep_gradients(model, None, edp)
    ops = [(r.op, r.n_bytes, len(r.participants)) for r in recording.records()]
    dist.barrier()
    return {
        "grads": {names[id(p)]: p.grad for p in model.parameters()},
        "experts": {names[id(p)] for p in moe.expert_parameters(model)},
        "kept": model.moe.routing.kept, "ops": ops, "loss": loss.item(),
    }  # fmt: skip


def _empty_rank_case(rank: int, world_size: int, impl: str) -> dict:
    """Rank 0 has no tokens this step: it still joins every exchange, with empty splits."""
    layer = moe.MoELayer(D, 4, D_FF, top_k=2, capacity_factor=1.0, seed=3)
    ep = moe.ExpertParallelMoE(layer, None, impl)
    x = _case_data(2, False)[0][: 0 if rank == 0 else T].clone().requires_grad_()
    y = ep(x)
    (y.square().sum() + ep.aux_loss).backward()
    grads = {n: p.grad for n, p in layer.named_parameters() if p.grad is not None}
    return {"y": y.detach(), "x_grad": x.grad, "aux": ep.aux_loss.item(), "grads": grads}


def _all(rank: int, world_size: int) -> dict:
    return {
        "dispatch": [_dispatch_case(rank, world_size, *c) for c in CASES[world_size]],
        "ep_dp": _ep_dp_case(rank, world_size) if world_size == 4 else None,
        "empty": [_empty_rank_case(rank, world_size, i) for i in moe.IMPLS]
        if world_size == 2
        else None,
    }


_RUNS: dict[int, list[dict]] = {}


def _runs(world_size: int) -> list[dict]:
    if world_size not in _RUNS:  # one launch per world size runs every case
        _RUNS[world_size] = lk.launch(
            _all, world_size=world_size, backend="labkit_record", device="cpu", timeout=180
        )
    return _RUNS[world_size]


def _reference(world_size: int, case) -> tuple[moe.MoELayer, torch.Tensor, torch.Tensor]:
    top_k, cf, _, skew = case
    x, grad_out = _case_data(world_size, skew)
    layer = _case_layer(world_size, top_k, cf, skew)
    x = x.clone().requires_grad_()
    y = layer(x, n_groups=world_size)  # each rank's tokens one group, on one process
    aux = [moe.load_balancing_loss(r.probs, r.experts) for r in layer.routing]
    sum(_loss(yg, gg, a) for yg, gg, a in zip(y.chunk(world_size), grad_out.chunk(world_size), aux,
                                             strict=True)).backward()  # fmt: skip
    return layer, x, y


def _params(cases: dict) -> list:
    marks = {4: pytest.mark.slow}
    return [
        pytest.param(p, i, id=f"p{p}-k{c[0]}-cf{c[1]}-{c[2]}{'-skew' if c[3] else ''}",
                     marks=marks.get(p, ()))
        for p in cases
        for i, c in enumerate(cases[p])
    ]  # fmt: skip


@pytest.mark.parametrize(("world_size", "index"), _params(CASES))
def test_expert_parallel_equals_one_process(world_size, index) -> None:
    case = CASES[world_size][index]
    per_rank = [r["dispatch"][index] for r in _runs(world_size)]
    layer, x, y = _reference(world_size, case)
    n_experts, ep = EXPERTS[world_size], world_size
    for rank, out in enumerate(per_rank):
        ref = layer.routing[rank]
        # the margin the exact comparison of routes relies on (no near-tie in the top k)
        top = ref.probs.topk(min(case[0] + 1, n_experts)).values
        assert (top[:, :-1] - top[:, 1:]).min() > 1e-4
        assert torch.equal(out["experts"], ref.experts) and torch.equal(out["kept"], ref.kept)
        torch.testing.assert_close(out["y"], y.detach().chunk(ep)[rank], **TOL)
        torch.testing.assert_close(out["x_grad"], x.grad.chunk(ep)[rank], **TOL)
        torch.testing.assert_close(out["aux"], moe.load_balancing_loss(ref.probs, ref.experts))
        # tokens per local expert from each source = what the sources' routing kept for it
        want = torch.stack([r.tokens_per_expert()[out["local"]] for r in layer.routing])
        assert torch.equal(out["received"], want)
    # every gradient: the router's summed over ranks (it is replicated), each expert's from its rank
    for name, p in layer.named_parameters():
        got = [o["grads"][name] for o in per_rank if name in o["grads"]]
        if name.startswith("router"):
            torch.testing.assert_close(sum(got), p.grad, **TOL, msg=name)
            continue
        holder = int(name.split(".")[1]) // (n_experts // ep)
        mine = per_rank[holder]["grads"].get(name)
        if p.grad is None:  # an expert no token reached has no gradient on either side
            assert mine is None, name
        else:
            torch.testing.assert_close(mine, p.grad, **TOL, msg=name)
    if case[1] == 1.0 and case[3]:  # the skewed router overflows expert 0: tokens are dropped
        assert (~layer.routing[0].kept).sum() >= T // 2


@pytest.mark.parametrize(("world_size", "index"), _params(CASES))
def test_all_to_all_messages_and_bytes_follow_the_routing(world_size, index) -> None:
    _, _, impl, _ = CASES[world_size][index]
    per_rank = [r["dispatch"][index] for r in _runs(world_size)]
    layer, _, _ = _reference(world_size, CASES[world_size][index])
    n_experts = EXPERTS[world_size]
    n_local = n_experts // world_size
    counts = torch.stack([r.tokens_per_expert() for r in layer.routing])  # [source, expert]
    per_rank_counts = counts.view(world_size, world_size, n_local).sum(-1)  # [source, dest]
    for rank, out in enumerate(per_rank):
        sent, received = per_rank_counts[rank], per_rank_counts[:, rank]
        S, R = int(sent.sum()), int(received.sum())
        a2a = [(n, dt) for op, n, dt, _ in out["ops"] if op == "all_to_all_single"]
        if impl == "p2p":  # counts by one all-to-all, rows by point-to-point messages
            assert a2a == [(8 * n_experts, "int64")]
            sends = [(n, peer) for op, n, _, peer in out["ops"] if op in ("send", "isend")]
            # forward and backward each: rows to every peer with a non-empty split, and back
            to = [p for p in range(world_size) if p != rank and sent[p]]
            back = [p for p in range(world_size) if p != rank and received[p]]
            assert sorted(sends) == sorted(
                [(4 * D * int(sent[p]), p) for p in to] * 2
                + [(4 * D * int(received[p]), p) for p in back] * 2
            )
        else:
            dtypes = ["int64"] + ["float32"] * 4
            assert a2a == list(zip(moe_all_to_all_bytes(S, R, D, n_experts), dtypes, strict=True))
            assert not any(op in ("send", "isend") for op, *_ in out["ops"])


@pytest.mark.parametrize("impl", moe.IMPLS)
def test_a_rank_without_tokens_takes_part_with_empty_splits(impl) -> None:
    out = [r["empty"][moe.IMPLS.index(impl)] for r in _runs(2)]
    layer = moe.MoELayer(D, 4, D_FF, top_k=2, capacity_factor=1.0, seed=3)
    x = _case_data(2, False)[0][:T].clone().requires_grad_()
    y = layer(x)  # rank 1's tokens alone: rank 0 sent nothing
    (y.square().sum() + layer.aux_loss).backward()
    assert out[0]["y"].shape == (0, D) and out[0]["aux"] == 0.0
    torch.testing.assert_close(out[1]["y"], y.detach(), **TOL)
    torch.testing.assert_close(out[1]["x_grad"], x.grad, **TOL)
    for name, p in layer.named_parameters():
        got = [o["grads"][name] for o in out if name in o["grads"]]
        torch.testing.assert_close(sum(got), p.grad, **TOL, msg=name)


def _ep_dp_reference() -> tuple[nn.Module, list[moe.Routing]]:
    model = _Net()
    x, y = _ep_dp_data()
    losses, routes = [], []
    for xs, ys in zip(x.chunk(4), y.chunk(4), strict=True):  # each rank's shard is a group
        losses.append(F.cross_entropy(model(xs), ys) + ALPHA * model.moe.aux_loss)
        routes += model.moe.routing
    torch.stack(losses).mean().backward()  # the mean over all tokens, one backward
    return model, routes


@pytest.mark.slow
def test_ep_times_dp_on_four_ranks_equals_one_process() -> None:
    per_rank = [r["ep_dp"] for r in _runs(4)]
    model, routes = _ep_dp_reference()
    ref = {n: p.grad for n, p in model.named_parameters()}
    n_dense = sum(p.numel() for n, p in model.named_parameters() if ".experts." not in n)
    for rank, out in enumerate(per_rank):
        assert torch.equal(out["kept"], routes[rank].kept)  # the same tokens dropped
        assert out["experts"] == {n for n in ref if n.startswith(f"moe.experts.{2 * (rank % 2)}")
                                  or n.startswith(f"moe.experts.{2 * (rank % 2) + 1}")}  # fmt: skip
        for name, g in out["grads"].items():
            want = ref[name] if ref[name] is not None else torch.zeros_like(g)
            torch.testing.assert_close(
                g, want, **TOL, msg=lambda s, n=name, r=rank: f"rank {r} {n}: {s}"
            )
        # two all-reduces: dense over the 4 dp ranks, the local experts over their 2 expert-dp ranks
        reduces = [(n, k) for op, n, k in out["ops"] if op == "all_reduce"]
        n_experts = sum(
            ref_p.numel() for n, ref_p in model.named_parameters() if n in out["experts"]
        )
        assert reduces == [(4 * n_dense, 4), (4 * n_experts, 2)]
        assert [k for op, _, k in out["ops"] if op == "all_to_all_single"] == [2] * 5  # ep group
