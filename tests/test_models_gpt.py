"""Tests for labkit/models/gpt.py: TinyGPT's shapes, causality, size formula, seeding, learning."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from labkit import models

V, H, L, HEADS, T = 23, 16, 2, 4, 12


def _gpt(**kw) -> models.TinyGPT:
    return models.TinyGPT(V, H, L, HEADS, T, **kw)


def test_shapes_and_layers() -> None:
    gpt = _gpt()
    assert len(gpt) == L + 2  # embedding, L blocks, head
    assert all(isinstance(gpt[i], models.TransformerBlock) for i in range(1, L + 1))
    idx = torch.randint(0, V, (3, T))
    assert gpt(idx).shape == (3, T, V)
    assert gpt(idx[:, :5]).shape == (3, 5, V)
    assert torch.equal(gpt(idx.float()), gpt(idx))  # float ids (pipeline buffers) are cast


@pytest.mark.parametrize("tie", [False, True])
def test_parameter_count_formula(tie: bool) -> None:
    for v, h, n, t in [(V, H, L, T), (65, 32, 3, 40), (2, 8, 1, 1)]:
        gpt = models.TinyGPT(v, h, n, 4, t, tie_weights=tie)
        assert models.count_parameters(gpt) == models.gpt_parameter_count(v, h, n, t, tie)
    tied = _gpt(tie_weights=True)
    assert tied[-1].lm_head.weight is tied[0].tok.weight


def test_future_tokens_do_not_change_past_logits() -> None:
    gpt = _gpt()
    idx = torch.randint(0, V, (2, T))
    changed = idx.clone()
    changed[:, 7:] = (changed[:, 7:] + 1) % V
    a, b = gpt(idx), gpt(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_gradient_of_a_past_logit_ignores_the_future() -> None:
    gpt = _gpt()
    x = gpt[0](torch.randint(0, V, (1, T))).detach().requires_grad_(True)
    out = x
    for layer in list(gpt)[1:]:
        out = layer(out)
    out[0, 4].sum().backward()
    assert x.grad[0, 5:].abs().max() == 0 and x.grad[0, :5].abs().max() > 0


def test_seed_gives_identical_weights_and_leaves_global_rng() -> None:
    torch.manual_seed(5)
    before = torch.rand(1)
    torch.manual_seed(5)
    a, b = _gpt(seed=3), _gpt(seed=3)
    assert torch.equal(torch.rand(1), before)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)
    assert not torch.equal(a[1].attn.q.weight, a[2].attn.q.weight)  # blocks differ
    assert not torch.equal(_gpt(seed=4)[0].tok.weight, a[0].tok.weight)


def test_loss_decreases_on_the_corpus() -> None:
    from labkit.data import char_corpus

    corpus = char_corpus()
    gpt = models.TinyGPT(corpus.vocab_size, 32, 2, 4, 32, seed=0)
    opt = torch.optim.Adam(gpt.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(15):
        x, y = corpus.batch(8, 32, generator=g)
        loss = F.cross_entropy(gpt(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(corpus.vocab_size)).item(), rel=0.1)
    assert sum(losses[-3:]) / 3 < 0.85 * losses[0]


def test_generate_appends_tokens_reproducibly() -> None:
    gpt = _gpt()
    prompt = torch.randint(0, V, (2, 3))
    a = gpt.generate(prompt, 20, generator=torch.Generator().manual_seed(1))
    b = gpt.generate(prompt, 20, generator=torch.Generator().manual_seed(1))
    assert a.shape == (2, 23) and torch.equal(a, b) and torch.equal(a[:, :3], prompt)
    assert a.min() >= 0 and a.max() < V
    greedy = gpt.generate(prompt, 1, temperature=0)
    assert torch.equal(greedy[:, -1], gpt(prompt)[:, -1].argmax(-1))


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="divisible"):
        models.TinyGPT(V, 10, 1, 4, T)
    with pytest.raises(ValueError, match="sizes must be"):
        models.TinyGPT(0, 16)
    with pytest.raises(ValueError, match="seq_len"):
        _gpt()(torch.zeros(1, T + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="temperature"):
        _gpt().generate(torch.zeros(1, 1, dtype=torch.long), 1, temperature=-1)
