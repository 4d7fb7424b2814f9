"""Exercises of notebooks/14_activation_recomputation.ipynb.

Introduced in notebooks/14_activation_recomputation.ipynb.

``14_saved_bytes``: the bytes one ``labkit.models.TransformerBlock`` keeps for backward, by
hand — under no recomputation, selective recomputation (the attention core is rebuilt in
backward) and full recomputation (only the block's input is kept), with the flash attention
kernel (an fp32 log-sum-exp per query row) or the math one (the s×s probabilities). The checker
needs no processes: for three shapes (batch ≠ sequence, several heads, an MLP width that is not
4h) it builds the block, checkpoints it with ``labkit.parallel.compose.apply_ac`` in each mode,
measures what autograd saves with ``lk.profile.saved_tensors`` under each kernel, and compares
the learner's count with the measurement, byte for byte. A wrong count is reported with the
model's tensors whose bytes would explain the difference (``labkit.memory``'s terms).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from labkit.exercises import ExerciseFailed, exercise
from labkit.memory import RECOMPUTE_MODES, block_activation_bytes, block_activation_terms
from labkit.models import TransformerBlock
from labkit.parallel.compose import apply_ac
from labkit.profile import saved_tensors

# (batch, seq_len, hidden, n_heads, ffn_hidden): batch ≠ seq_len, heads ≠ 1, ffn ≠ 4h in two
CASES = ((2, 8, 16, 2, 64), (3, 5, 12, 3, 20), (4, 6, 8, 2, 24))
ATTENTIONS = ("flash", "softmax")  # scaled_dot_product_attention's CPU default, and MATH

PROMPT = """Write `saved_bytes(batch, seq_len, hidden, n_heads, ffn_hidden, recompute,
attention)`: the bytes one `lk.models.TransformerBlock(hidden, n_heads, hidden=ffn_hidden)`
keeps for backward between its forward and its backward, in fp32, as `lk.profile.saved_tensors`
counts them (each storage once, parameters left out) — with `recompute` "none", "selective"
(`apply_ac(block, names, mode="selective")`: the attention core is recomputed in backward) or
"full" (`mode="full"`), and `attention` "flash" (scaled_dot_product_attention's default kernel
on the CPU) or "softmax" (under `sdpa_kernel(SDPBackend.MATH)`). Count by hand from the
tensors you saw in the table, not with lk.memory."""

_LABKIT_BLOCK = {"bytes_per_element": 4, "dropout": False, "layernorm_stat_bytes": 4}


def saved_bytes(
    batch: int,
    seq_len: int,
    hidden: int,
    n_heads: int,
    ffn_hidden: int,
    recompute: str,
    attention: str,
) -> int:
    """Reference solution of ``14_saved_bytes``: labkit's block under its own assumptions.

    ``labkit.memory.block_activation_bytes`` with fp32 activations, no dropout and fp32
    LayerNorm statistics (Korthikanti et al. 2022, §4.1 and §5, with labkit's block's terms).

    Args:
        batch: b.
        seq_len: s.
        hidden: h.
        n_heads: a.
        ffn_hidden: the MLP's inner width.
        recompute: ``"none"``, ``"selective"`` or ``"full"``.
        attention: ``"flash"`` or ``"softmax"``.

    Returns:
        The bytes, an int.
    """
    kw = _LABKIT_BLOCK | {"ffn_hidden": ffn_hidden, "attention": attention, "recompute": recompute}
    return int(block_activation_bytes(seq_len, batch, hidden, n_heads, **kw))


def measure(case: tuple[int, ...], recompute: str, attention: str) -> int:
    """What autograd keeps for one forward of labkit's block, checkpointed in ``recompute``.

    Args:
        case: (batch, seq_len, hidden, n_heads, ffn_hidden).
        recompute: ``"none"``, ``"selective"`` or ``"full"``.
        attention: ``"flash"`` (the default kernel) or ``"softmax"`` (``SDPBackend.MATH``).

    Returns:
        Bytes counted by ``lk.profile.saved_tensors``.
    """
    b, s, h, a, f = case
    block = TransformerBlock(h, n_heads=a, hidden=f, seed=0)
    if recompute != "none":
        apply_ac(block, [""], mode=recompute)  # "": the block itself
    x = torch.randn(b, s, h, generator=torch.Generator().manual_seed(0), requires_grad=True)
    kernel = sdpa_kernel(SDPBackend.MATH) if attention == "softmax" else contextlib.nullcontext()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny block: one thread is faster on a shared CPU
    try:
        with kernel, saved_tensors(exclude=block.parameters()) as saved:
            block(x)
    finally:
        torch.set_num_threads(threads)
    return saved.total_bytes


def _explain(diff: int, case: tuple[int, ...]) -> str:
    """The model's tensors whose bytes are ``|diff|``: one tensor, or one of each LayerNorm."""
    b, s, h, a, f = case
    kw = _LABKIT_BLOCK | {"ffn_hidden": f}
    terms = block_activation_terms(s, b, h, a, attention="softmax", **kw)
    terms |= block_activation_terms(s, b, h, a, attention="flash", **kw)
    found = [repr(x) for x, v in terms.items() if v == abs(diff)]
    found += [
        f"{x!r} + {x.replace('ln1', 'ln2')!r}"
        for x, v in terms.items()
        if x.startswith("ln1") and 2 * v == abs(diff)
    ]
    return f" — the size of {' or '.join(found[:4])}" if found else ""


@exercise("14_saved_bytes", reference=saved_bytes, prompt=PROMPT)
def check_saved_bytes(fn: Callable[..., Any]) -> dict[str, Any]:
    """Compare a learner's count with what autograd keeps, every shape, mode and kernel.

    Args:
        fn: the learner's ``saved_bytes(batch, seq_len, hidden, n_heads, ffn_hidden,
            recompute, attention)``.

    Returns:
        ``{"cases": [...], "measured": {(case, recompute, attention): bytes}}``.

    Raises:
        ExerciseFailed: a count that is not a whole number of bytes or differs from the
            measurement (the message names the block, the mode and the tensors the difference
            could be).
        NotImplementedError: not attempted yet (``check`` then runs the reference).
    """
    measured = {}
    for case in CASES:
        for recompute in RECOMPUTE_MODES:
            for attention in ATTENTIONS:
                want = measure(case, recompute, attention)
                try:
                    got = fn(*case, recompute, attention)
                except NotImplementedError:
                    raise
                except Exception as exc:  # a learner's bug: report it as a failed check
                    raise ExerciseFailed(
                        f"saved_bytes{(*case, recompute, attention)} raised "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
                b, s, h, a, f = case
                where = (
                    f"batch={b}, seq_len={s}, hidden={h}, n_heads={a}, ffn_hidden={f}, "
                    f"recompute={recompute!r}, attention={attention!r}"
                )
                if isinstance(got, bool) or not isinstance(got, int | float) or got != int(got):
                    raise ExerciseFailed(f"{where}: got {got!r}, a count of bytes is an int")
                if got != want:
                    diff = int(got) - want
                    how = "over" if diff > 0 else "short"
                    raise ExerciseFailed(
                        f"{where}: you counted {int(got):,} bytes, autograd keeps {want:,}: "
                        f"{abs(diff):,} bytes {how}{_explain(diff, case)}"
                    )
                measured[(case, recompute, attention)] = want
    return {"cases": [list(c) for c in CASES], "measured": measured}
