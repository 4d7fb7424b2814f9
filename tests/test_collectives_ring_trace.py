"""The ring all-reduce run on simulated ranks equals the real one, step by step."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.collectives import P2P, allreduce_ring, expected_bytes, expected_messages
from labkit.collectives.ring import _all_gather, _reduce_scatter
from labkit.collectives.ring_trace import trace_ring_allreduce


def _inputs(p: int, n: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10, (p, n), generator=gen).float()


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [1, 3, 8, 10])
def test_final_buffers_are_the_sum(p, n):
    x = _inputs(p, n)
    trace = trace_ring_allreduce(x)
    for r in range(p):
        torch.testing.assert_close(torch.tensor(trace.result[r]), x.sum(0), rtol=0, atol=0)
    assert len(trace.steps) == 2 * (p - 1)
    assert [s.phase for s in trace.steps] == ["reduce-scatter"] * (p - 1) + ["all-gather"] * (p - 1)
    assert len(trace.states()) == 2 * (p - 1) + 1


@pytest.mark.parametrize("p", [2, 3, 4])
def test_messages_counted_as_the_real_algorithm(p):
    n = 10
    trace = trace_ring_allreduce(_inputs(p, n))
    for r, stats in enumerate(trace.stats):
        assert stats.messages_sent == expected_messages("ring", p, r) == 2 * (p - 1)
        assert stats.messages_received == expected_messages("ring", p, r, direction="recv")
        assert stats.bytes_sent == expected_bytes("ring", p, n, 4, r)


def test_transfers_follow_the_ring():
    p = 4
    trace = trace_ring_allreduce(_inputs(p, 8))
    for k, step in enumerate(trace.steps):
        s = step.step
        assert [(t.src, t.dst) for t in step.transfers] == [(r, (r + 1) % p) for r in range(p)]
        # Thakur et al. §4: reduce-scatter step s sends chunk (r−s−1) mod p, all-gather (r−s).
        shift = -s - 1 if step.phase == "reduce-scatter" else -s
        assert [t.chunk for t in step.transfers] == [(r + shift) % p for r in range(p)]
        for t in step.transfers:
            a, b = trace.chunks[t.chunk]
            assert list(t.values) == step.before[t.src][a:b]
        assert step.before == (trace.steps[k - 1].after if k else trace.inputs)


def test_reduce_scatter_leaves_chunk_r_reduced_on_rank_r():
    p, n = 4, 9
    x = _inputs(p, n, seed=3)
    trace = trace_ring_allreduce(x)
    after_rs = trace.steps[p - 2]
    total = x.sum(0).tolist()
    for r, (a, b) in enumerate(trace.chunks):
        assert after_rs.after[r][a:b] == total[a:b]
        assert all(who == tuple(range(p)) for who in after_rs.contributors[r][a:b])
    final = trace.steps[-1].contributors
    assert all(who == tuple(range(p)) for row in final for who in row)


def test_other_ops_and_bad_input():
    x = _inputs(3, 5)
    trace = trace_ring_allreduce(x, op="max")
    assert trace.result[0] == x.max(0).values.tolist()
    with pytest.raises(ValueError, match="one 1-D buffer"):
        trace_ring_allreduce(torch.zeros(4))
    with pytest.raises(ValueError, match="unsupported"):
        trace_ring_allreduce(x, op="band")
    with pytest.raises(TypeError, match="AVG"):
        trace_ring_allreduce(x.long(), op="avg")
    avg = trace_ring_allreduce(x, op="avg")
    torch.testing.assert_close(torch.tensor(avg.result[1]), x.mean(0), rtol=1e-6, atol=1e-6)


def _real_states(rank: int, world_size: int, inputs: torch.Tensor) -> dict:
    """The real ring over gloo, this rank's buffer copied at every step boundary."""

    class Snapshots(P2P):
        def __init__(self, flat: torch.Tensor) -> None:
            super().__init__()
            self.flat, self.states = flat, []

        def at(self, phase: str, step: int = 0) -> P2P:
            self.states.append(self.flat.tolist())
            return super().at(phase, step)

    flat = inputs[rank].clone()
    p2p = Snapshots(flat)
    _reduce_scatter(p2p, flat, "sum")
    _all_gather(p2p, flat)
    check = inputs[rank].clone()
    allreduce_ring(check)
    reference = inputs[rank].clone()
    dist.all_reduce(reference)
    return {"states": p2p.states + [flat.tolist()], "public": check, "torch": reference}


def test_every_step_matches_the_real_algorithm_over_gloo():
    p = 3  # odd, and 7 elements: chunks of different sizes
    x = _inputs(p, 7, seed=p)
    trace = trace_ring_allreduce(x)
    real = lk.launch(
        _real_states, world_size=p, args=(x,), backend="gloo", device="cpu", timeout=120
    )
    simulated = trace.states()
    for r in range(p):
        assert [state[r] for state in simulated] == real[r]["states"]
        torch.testing.assert_close(torch.tensor(trace.result[r]), real[r]["public"])
        torch.testing.assert_close(torch.tensor(trace.result[r]), real[r]["torch"])
