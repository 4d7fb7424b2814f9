"""Tests for labkit/models.py: shapes, seeding and the size-dialled MLP."""

from __future__ import annotations

import pytest
import torch

from labkit import models


def test_same_seed_same_parameters_without_touching_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = models.MLP(seed=7), models.CNN(seed=7)
    after = torch.rand(1)
    assert torch.equal(before, after)  # building models did not consume the global RNG
    for m, twin in ((a, models.MLP(seed=7)), (b, models.CNN(seed=7))):
        for p, q in zip(m.parameters(), twin.parameters(), strict=True):
            assert torch.equal(p, q)
    assert not torch.equal(models.MLP(seed=8).net[0].weight, a.net[0].weight)


def test_shapes_flat_and_image_inputs():
    x = torch.rand(5, 64)
    assert models.MLP()(x).shape == (5, 10)
    assert models.CNN()(x).shape == (5, 10)
    assert models.CNN()(x.view(5, 1, 8, 8)).shape == (5, 10)
    assert models.MLP(in_features=3, hidden=(), out_features=2)(torch.rand(4, 3)).shape == (4, 2)


@pytest.mark.parametrize("n", [1, 10_000, 5_000_000])
def test_mlp_with_parameters_is_smallest_multiple_of_64(n):
    m = models.mlp_with_parameters(n, n_layers=3)
    size = models.count_parameters(m)
    assert size >= n
    h = m.net[0].out_features
    if h > 64:
        smaller = models.MLP(64, (h - 64,) * 3, 10)
        assert models.count_parameters(smaller) < n


def test_mlp_with_parameters_rejects_bad_input():
    with pytest.raises(ValueError, match="n_params"):
        models.mlp_with_parameters(0)


def test_compute_delay_is_an_identity_that_takes_time():
    import time

    layer = models.ComputeDelay(forward_ms=5, backward_ms=15)
    x = torch.randn(3, 4, requires_grad=True)
    start = time.perf_counter()
    y = layer(x)
    forward_s = time.perf_counter() - start
    assert torch.equal(y, x) and forward_s >= 5e-3
    start = time.perf_counter()
    (y * torch.arange(4.0)).sum().backward()
    assert time.perf_counter() - start >= 15e-3
    assert torch.equal(x.grad, torch.arange(4.0).expand(3, 4))
    assert "backward_ms=15" in repr(layer)
    with pytest.raises(ValueError, match=">= 0 ms"):
        models.ComputeDelay(backward_ms=-1)


def test_self_attention_matches_torch_multihead_attention():
    attn = models.SelfAttention(dim=16, n_heads=4, causal=True, seed=0)
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([attn.q.weight, attn.k.weight, attn.v.weight]))
        ref.in_proj_bias.copy_(torch.cat([attn.q.bias, attn.k.bias, attn.v.bias]))
        ref.out_proj.weight.copy_(attn.proj.weight)
        ref.out_proj.bias.copy_(attn.proj.bias)
    x = torch.randn(2, 5, 16)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5)
    want, _ = ref(x, x, x, attn_mask=mask, need_weights=False)
    torch.testing.assert_close(attn(x), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="not divisible"):
        models.SelfAttention(dim=10, n_heads=4)


def test_transformer_block_is_causal_and_seeded():
    block = models.TransformerBlock(dim=16, n_heads=4, seed=3)
    assert models.count_parameters(block) == 4 * (16 * 16 + 16) + 2 * 2 * 16 + 16 * 64 * 2 + 64 + 16
    x = torch.randn(1, 6, 16)
    y = block(x)
    x2 = x.clone()
    x2[:, 4:] += 1.0  # change the future: the first four positions must not move
    torch.testing.assert_close(block(x2)[:, :4], y[:, :4], rtol=0, atol=0)
    same = models.TransformerBlock(dim=16, n_heads=4, seed=3)
    assert all(
        torch.equal(a, b) for a, b in zip(block.parameters(), same.parameters(), strict=True)
    )
    ff = models.FeedForward(16, 32, seed=1)
    assert ff(x).shape == x.shape and ff.fc1.out_features == 32
