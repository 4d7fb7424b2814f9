"""Tests for labkit/viz/collectives.py: diagrams drawn headless from reference data."""

from __future__ import annotations

import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Text

from labkit.viz import collective_diagram, value_origins
from labkit.viz.collectives import _NEUTRAL, MAX_BOXES


def _inputs(p: int) -> list[list[int]]:
    return [[10 * r, 10 * r + 1] for r in range(p)]


def _reference(name: str, p: int) -> tuple[list, list]:
    """Before/after of each collective on p ranks, computed in one process."""
    x = _inputs(p)
    flat = [v for row in x for v in row]
    if name == "broadcast":
        return x, [x[0]] * p
    if name == "reduce":
        return x, [[sum(c) for c in zip(*x, strict=True)]] + [None] * (p - 1)
    if name == "all_reduce":
        return x, [[sum(c) for c in zip(*x, strict=True)]] * p
    if name == "gather":
        return x, [flat] + [None] * (p - 1)
    if name == "scatter":
        return [flat] + [None] * (p - 1), x
    if name == "all_gather":
        return x, [flat] * p
    if name == "reduce_scatter":
        rows = [[10 * r + j for j in range(2 * p)] for r in range(p)]
        total = [sum(c) for c in zip(*rows, strict=True)]
        return rows, [total[2 * r : 2 * r + 2] for r in range(p)]
    if name == "all_to_all":
        rows = [[10 * r + j for j in range(p)] for r in range(p)]
        return rows, [[rows[src][dst] for src in range(p)] for dst in range(p)]
    raise KeyError(name)


COLLECTIVES = [
    "broadcast",
    "reduce",
    "all_reduce",
    "gather",
    "scatter",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
]


def _texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


def _render(fig: Figure) -> None:
    FigureCanvasAgg(fig).draw()  # headless; raises if anything cannot be drawn


@pytest.mark.parametrize("p", [2, 3, 8])
@pytest.mark.parametrize("name", COLLECTIVES)
def test_diagram_shows_every_rank_and_value(name: str, p: int) -> None:
    before, after = _reference(name, p)
    fig = collective_diagram(name, before, after)
    _render(fig)
    texts = _texts(fig)
    for rank in range(p):
        assert f"rank {rank}" in texts
    values = [v for side in (before, after) for row in side if row for v in row]
    for v in values:
        assert str(v) in texts, f"value {v} not drawn"
    assert f"{name} on {p} ranks" in texts
    assert "before" in texts and "after" in texts
    none_rows = sum(row is None for side in (before, after) for row in side)
    assert texts.count("(none)") == none_rows
    # one box per drawn value
    n_boxes = sum(isinstance(a, Rectangle) for a in fig.axes[0].patches)
    assert n_boxes == len(values)
    assert fig.get_figwidth() <= 15.5


def test_tensors_and_lists_give_the_same_figure() -> None:
    before = [torch.tensor([0.0, 1.0]), torch.tensor([10.0, 11.0])]
    after = [torch.tensor([10.0, 12.0])] * 2
    from_tensors = _texts(collective_diagram("all_reduce", before, after))
    from_lists = _texts(collective_diagram("all_reduce", _inputs(2), [[10, 12]] * 2))
    assert from_tensors == from_lists
    assert "0" in from_tensors and "0.0" not in from_tensors  # integral floats print as ints


def test_title_and_non_integer_values() -> None:
    fig = collective_diagram("x", [[0.125, -2.5]], [[1 / 3]], title="my title")
    texts = _texts(fig)
    assert "my title" in texts
    assert {"0.125", "-2.5", "0.333"} <= set(texts)


def _colours(fig: Figure, width_before: int) -> tuple[list[tuple], list[tuple]]:
    """Face colours of the before and after boxes, rank by rank, left to right."""
    boxes = [a for a in fig.axes[0].patches if isinstance(a, Rectangle)]
    boxes.sort(key=lambda b: (-b.get_y(), b.get_x()))
    before = [tuple(b.get_facecolor()) for b in boxes if b.get_x() < width_before]
    after = [tuple(b.get_facecolor()) for b in boxes if b.get_x() >= width_before]
    return before, after


def test_reductions_are_grey_even_when_a_sum_equals_an_input() -> None:
    # On 2 ranks the sum of [0, 1] and [10, 11] is [10, 12]: 10 is also rank 1's input.
    fig = collective_diagram("all_reduce", _inputs(2), [[10, 12]] * 2)
    grey = to_rgba(_NEUTRAL)
    before, after = _colours(fig, 2)
    assert after == [grey] * 4 and grey not in before
    traced = collective_diagram("all_reduce", _inputs(2), [[10, 12]] * 2, reduced=False)
    _, after = _colours(traced, 2)
    assert after[0] == before[2]  # 10 traced to rank 1, the only rank that held it
    assert after[1] == grey  # 12 was held by no rank


def test_copied_values_keep_their_rank_colour() -> None:
    before, after = _reference("all_gather", 3)
    fig = collective_diagram("all_gather", before, after)
    before_colours, after_colours = _colours(fig, 2)
    assert after_colours == before_colours * 3
    assert len(set(before_colours[::2])) == 3  # three ranks, three colours


def test_long_buffers_are_cut_with_a_count() -> None:
    fig = collective_diagram("big", [list(range(100))], [[1]])
    texts = _texts(fig)
    assert f"+{100 - (MAX_BOXES - 1)}" in texts
    assert str(MAX_BOXES - 2) in texts and str(MAX_BOXES - 1) not in texts


def test_empty_buffer_is_marked() -> None:
    assert "(empty)" in _texts(collective_diagram("x", [[1], [2]], [[], [3]]))


def test_figure_is_not_registered_with_pyplot() -> None:
    fig = collective_diagram("all_gather", *_reference("all_gather", 2))
    assert isinstance(fig, Figure)
    assert fig.canvas.manager is None


@pytest.mark.parametrize(
    ("before", "after", "error"),
    [
        ([[1], [2]], [[3]], ValueError),
        ([], [], ValueError),
        ("ab", ["a", "b"], TypeError),
    ],
)
def test_bad_input_is_rejected(before, after, error) -> None:
    with pytest.raises(error):
        collective_diagram("x", before, after)


def test_value_origins_traces_copies_and_not_sums() -> None:
    before, after = _reference("all_to_all", 3)
    origins = value_origins(before, after)
    assert origins == [[0, 1, 2]] * 3
    before, after = _reference("gather", 3)
    assert value_origins(before, after) == [[0, 0, 1, 1, 2, 2], None, None]
    before, after = _reference("all_reduce", 3)  # [30, 33]: held by no rank
    assert value_origins(before, after) == [[None, None]] * 3
    assert value_origins([[5], [5]], [[5], [5]]) == [[None], [None]]  # ambiguous
    with pytest.raises(ValueError):
        value_origins([[1]], [[1], [2]])
