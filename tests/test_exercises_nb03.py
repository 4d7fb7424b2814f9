"""Tests for labkit/exercises/nb03.py: the reference passes, wrong answers fail with a reason."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit as lk
from labkit.exercises import ExerciseFailed, nb03

NAME = "03_ring_all_gather"


def test_reference_passes_its_checker() -> None:
    ex = lk.exercises.get(NAME)
    assert ex.reference is nb03.ring_all_gather
    assert ex.checker(ex.reference) == {"world_sizes": [2, 3, 4], "sizes": [2, 10]}


def test_labkit_all_gather_ring_and_raw_isend_irecv_pass() -> None:
    assert lk.exercises.check(NAME, lk.collectives.all_gather_ring).status == "passed"

    def with_dist(tensor, group=None):  # plain torch.distributed, blocking order by parity
        p, r = dist.get_world_size(group), dist.get_rank(group)
        chunks = [tensor[a:b] for a, b in lk.collectives.chunk_bounds(tensor.numel(), p)]
        for s in range(p - 1):
            works = [
                dist.irecv(chunks[(r - s - 1) % p], (r - 1) % p),
                dist.isend(chunks[(r - s) % p], (r + 1) % p),
            ]
            for w in works:
                w.wait()

    assert lk.exercises.check(NAME, with_dist).status == "passed"


def test_not_attempted_falls_back_to_the_reference(capsys) -> None:
    def todo(tensor, group=None):
        raise NotImplementedError("your code here")

    assert lk.exercises.check(NAME, todo).status == "reference"
    assert "not attempted" in capsys.readouterr().out


def _stale_forwarding(tensor, group=None):
    """Forwards chunks from a copy taken before the loop, not the ones that just arrived."""
    p2p = lk.collectives.P2P(group)
    p, r = p2p.world_size, p2p.rank
    bounds = lk.collectives.chunk_bounds(tensor.numel(), p)
    before = tensor.clone()
    for s in range(p - 1):
        (a, b), (c, d) = bounds[(r - s) % p], bounds[(r - s - 1) % p]
        p2p.exchange(before[a:b], (r + 1) % p, tensor[c:d], (r - 1) % p)


def _one_step_only(tensor, group=None):
    p2p = lk.collectives.P2P(group)
    p, r = p2p.world_size, p2p.rank
    chunks = [tensor[a:b] for a, b in lk.collectives.chunk_bounds(tensor.numel(), p)]
    if p > 1:
        p2p.exchange(chunks[r], (r + 1) % p, chunks[(r - 1) % p], (r - 1) % p)


def _whole_buffer_every_step(tensor, group=None):
    """Right result, destinations and counts, but every step forwards the whole buffer."""
    p2p = lk.collectives.P2P(group)
    p, r = p2p.world_size, p2p.rank
    bounds = lk.collectives.chunk_bounds(tensor.numel(), p)
    incoming = torch.empty_like(tensor)
    for s in range(p - 1):
        p2p.exchange(tensor, (r + 1) % p, incoming, (r - 1) % p)
        a, b = bounds[(r - s - 1) % p]
        tensor[a:b] = incoming[a:b]  # keep only the chunk that is new here


def _uses_all_gather(tensor, group=None):
    p = dist.get_world_size(group)
    parts = [torch.empty_like(tensor) for _ in range(p)]
    dist.all_gather(parts, tensor, group=group)


def _star_through_rank_0(tensor, group=None):
    """Right answer, wrong algorithm: everyone sends its chunk to rank 0, which sends all."""
    p, r = dist.get_world_size(group), dist.get_rank(group)
    bounds = lk.collectives.chunk_bounds(tensor.numel(), p)
    if r == 0:
        for src in range(1, p):
            a, b = bounds[src]
            dist.recv(tensor[a:b], src)
        for dst in range(1, p):
            dist.send(tensor, dst)
    else:
        a, b = bounds[r]
        dist.send(tensor[a:b].clone(), 0)
        dist.recv(tensor, 0)


@pytest.mark.parametrize(
    ("wrong", "match"),
    [
        (_stale_forwarding, r"chunk \d .* should be rank \d's chunk but is still the placeholder"),
        (_one_step_only, "never received|should be rank"),
        (_uses_all_gather, "dist.all_gather does the work this exercise builds"),
        # On 2 ranks a star is a one-step ring that sends the whole buffer.
        (_star_through_rank_0, r"sent \d message\(s\) to rank\(s\)|whole buffer"),
        (_whole_buffer_every_step, r"send in step 0 carried 2 element\(s\).*the whole buffer"),
    ],
    ids=["stale-forwarding", "one-step", "all_gather", "star", "whole-buffer"],
)
def test_wrong_answers_fail_with_a_reason(wrong, match) -> None:
    with pytest.raises(ExerciseFailed, match=match):
        lk.exercises.check(NAME, wrong)


def test_send_counting_sees_each_send_once() -> None:
    def fn(rank, world_size):
        log: list[tuple[int, int]] = []
        with nb03._watch_sends(log):
            peer = 1 - rank
            buf = torch.empty(3)
            if rank == 0:
                dist.send(torch.ones(3), peer)
                dist.isend(torch.ones(3), group_dst=peer).wait()
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.recv(buf, peer)
                ops = [dist.P2POp(dist.isend, torch.ones(3), peer)]
                for w in dist.batch_isend_irecv(ops):
                    w.wait()
        return log, dist.send is nb03.c10d.send

    out = lk.launch(fn, world_size=2, backend="gloo", device="cpu", timeout=60)
    assert out == [([(1, 3), (1, 3)], True), ([(0, 3)], True)]
