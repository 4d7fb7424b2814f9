"""What one transformer block keeps for backward per rank, term by term, under each parallelism.

Introduced in notebooks/15_sequence_parallel.ipynb.

Bars come from ``labkit.memory.block_activation_terms`` (Korthikanti et al. 2022, §4: what
tensor parallelism divides by t and what it leaves whole, and what sequence parallelism divides
too); the measured totals (``lk.profile.saved_tensors``) are drawn as marks. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Mapping

from matplotlib.figure import Figure

__all__ = ["activation_terms"]

# The terms of labkit.memory.block_activation_terms, coloured by where they live in the block.
_NORM = ("ln1", "ln2", "attention dropout mask", "MLP dropout mask")  # the LayerNorm regions
_GEMM_INPUT = ("q, k, v input", "fc1 input")  # gathered into the column-parallel GEMMs


def _colour(term: str) -> str:
    if term.startswith(_NORM):
        return "#dd8452"  # LayerNorm / dropout region: whole under TP, 1/t under SP
    if term in _GEMM_INPUT:
        return "#c44e52"  # the column GEMMs' inputs: whole under TP, 1/t with SP's re-gather
    return "#4c72b0"  # inside attention and the MLP: 1/t under TP already


def activation_terms(
    cases: Mapping[str, Mapping[str, float]],
    measured: Mapping[str, float] | None = None,
    title: str = "",
) -> Figure:
    """Stacked bars of the bytes each term keeps per rank, one bar per case.

    Args:
        cases: case name (e.g. "unsplit", "TP", "SP") → term → bytes per rank, as
            ``labkit.memory.block_activation_terms`` returns them.
        measured: case name → bytes measured per rank, drawn as a black tick on its bar.
        title: the figure's title.

    Returns:
        matplotlib.figure.Figure: kB per rank; orange: the LayerNorm regions (whole under
        tensor parallelism), red: the column GEMMs' inputs, blue: the rest (split by heads or
        MLP columns).

    Raises:
        ValueError: no cases.
    """
    if not cases:
        raise ValueError("activation_terms needs at least one case")
    fig = Figure(figsize=(2.2 + 1.6 * len(cases), 4), layout="constrained")
    ax = fig.subplots()
    for x, terms in enumerate(cases.values()):
        bottom = 0.0
        for term, nbytes in terms.items():
            ax.bar(x, nbytes / 1e3, bottom=bottom, color=_colour(term), edgecolor="white",
                   linewidth=0.6, width=0.6)  # fmt: skip
            bottom += nbytes / 1e3
        ax.text(x, bottom, f"{bottom:,.1f} kB", ha="center", va="bottom", fontsize=8)
    if measured:
        names = list(cases)
        xs = [names.index(n) for n in measured]
        ax.scatter(xs, [v / 1e3 for v in measured.values()], marker="_", s=900, color="black",
                   zorder=3, label="measured")  # fmt: skip
    for colour, label in (("#dd8452", "LayerNorm regions"), ("#c44e52", "column GEMM inputs"),
                          ("#4c72b0", "split by heads / columns")):  # fmt: skip
        ax.bar([0], [0], color=colour, label=label)
    ax.set_xticks(range(len(cases)), list(cases))
    ax.set_ylabel("kB kept for backward per rank")
    ax.legend(fontsize=8)
    ax.set_title(title or "one block's activations per rank")
    return fig
