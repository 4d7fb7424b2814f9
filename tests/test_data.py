"""Tests for labkit/data.py: the shipped digits and synthetic regression data."""

from __future__ import annotations

import pytest
import torch

from labkit import data


def test_digits_split_is_a_fixed_partition():
    train, test, full = data.digits("train"), data.digits("test"), data.digits("all")
    assert len(train) + len(test) == len(full) == 1797
    x, y = train.tensors
    assert x.dtype == torch.float32 and x.shape[1] == 64 and 0.0 <= x.min() and x.max() <= 1.0
    assert y.dtype == torch.int64 and set(y.tolist()) == set(range(10))
    again = data.digits("train")
    assert torch.equal(again.tensors[0], x)
    rows = {tuple(r.tolist()) + (int(c),) for r, c in zip(*full.tensors, strict=True)}
    assert all(tuple(r.tolist()) + (int(c),) in rows for r, c in zip(*test.tensors, strict=True))


def test_digits_images_and_errors():
    assert data.digits("test", images=True).tensors[0].shape[1:] == (1, 8, 8)
    with pytest.raises(ValueError, match="split"):
        data.digits("valid")
    with pytest.raises(ValueError, match="test_fraction"):
        data.digits(test_fraction=1.0)


def test_synthetic_regression_recovers_true_weights():
    ds, w, b = data.synthetic_regression(512, 4, 2, noise=0.0, seed=3)
    x, y = ds.tensors
    sol = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1)], 1), y).solution
    torch.testing.assert_close(sol[:4].T, w, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sol[4], b, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        data.synthetic_regression(0)


def test_shard_loader_needs_a_process_group():
    # In a rank it is exercised by tests/test_parallel_ddp.py (every shard, padding, drop_last).
    with pytest.raises(ValueError, match="initialised process group"):
        data.shard_loader(data.digits("test"), 4)


def test_char_corpus_is_real_text_read_from_disk() -> None:
    corpus = data.char_corpus()
    files = data.corpus_files()
    assert corpus.sources == tuple(f.name for f in files) and len(files) >= 5
    assert corpus.text.startswith(files[0].read_text(encoding="utf-8")[:200])
    assert len(corpus.text) > 20_000 and "the" in corpus.text
    assert corpus.chars == "".join(sorted(set(corpus.text)))
    assert len(corpus.train) + len(corpus.val) == len(corpus.text)
    assert len(corpus.val) == round(0.1 * len(corpus.text))
    assert corpus.decode(torch.cat([corpus.train, corpus.val])) == corpus.text
    assert torch.equal(
        corpus.encode("the data"),
        corpus.train.new_tensor([corpus.chars.index(c) for c in "the data"]),
    )


def test_char_corpus_batches_are_next_character_windows() -> None:
    corpus = data.char_corpus(val_fraction=0.2)
    x, y = corpus.batch(4, 16, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row_x, row_y in zip(x, y, strict=True):
        assert corpus.decode(row_x) + corpus.decode(row_y[-1:]) in corpus.decode(corpus.train)
    xv, _ = corpus.batch(2, 8, "val", generator=torch.Generator().manual_seed(0))
    assert all(corpus.decode(r) in corpus.decode(corpus.val) for r in xv)
    again = corpus.batch(4, 16, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again[0], x)


def test_char_corpus_from_given_files_and_errors(tmp_path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("abcabc")
    b.write_text("xyz")
    corpus = data.char_corpus(0.25, files=[a, b])
    assert corpus.text == "abcabc\n\nxyz" and corpus.chars == "\nabcxyz"
    assert corpus.sources == ("a.txt", "b.txt")
    with pytest.raises(ValueError, match="val_fraction"):
        data.char_corpus(0.0)
    with pytest.raises(ValueError, match="not in the vocabulary"):
        corpus.encode("q")
    with pytest.raises(ValueError, match="split"):
        corpus.batch(1, 2, "test")
    with pytest.raises(ValueError, match="seq_len"):
        corpus.batch(1, 100)
