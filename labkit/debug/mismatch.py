"""The report of ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` on mismatched collectives, read into data.

Introduced in notebooks/19_fault_tolerance.ipynb (section 5, debugging a distributed job).

With ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` every process group is wrapped in a checker
(``torch.distributed``'s ``_ProcessGroupWrapper``, "Debugging torch.distributed applications"
in the PyTorch documentation) that, before each collective, exchanges a *fingerprint* of it
among the ranks over a side gloo group. When they differ, every rank raises::

    Detected mismatch between collectives on ranks. Rank 0 is running collective:
    CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[4],
    TensorDtypes=Float, TensorDeviceTypes=...), but Rank 1 is running collective:
    CollectiveFingerPrint(SequenceNumber=1, OpType=BROADCAST, ...).Collectives differ in the
    following aspects:   Op type: ALLREDUCEvs BROADCAST

(one line; this layout was read from torch 2.13's messages). The rank that raised is named
first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_RANK = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(")
_SEQ = re.compile(r"SequenceNumber=(\d+),?\s*OpType=(\w+)")
_SHAPES = re.compile(r"TensorShape=((?:\[[\d, ]*\](?:, )?)+)")
_DTYPES = re.compile(r"TensorDtypes=([A-Za-z0-9_, ]+?)(?:, TensorDeviceTypes=|\))")
_DIFF = "Collectives differ in the following aspects:"


@dataclass(frozen=True)
class Fingerprint:
    """What one rank was about to run, as the DETAIL checker saw it.

    Attributes:
        rank: the rank.
        sequence_number: the collective's number in its group, counted by the checker from 0.
        op: the operation (``"ALLREDUCE"``, ``"BROADCAST"``, ...).
        shapes: the shape of each tensor argument (empty when the report omits them).
        dtypes: the dtype of each tensor argument (``"Float"``, ...), or empty.
    """

    rank: int
    sequence_number: int
    op: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]


@dataclass(frozen=True)
class CollectiveMismatch:
    """A DETAIL mismatch report: the raising rank's fingerprint, its peer's, and what differs.

    Attributes:
        this: the fingerprint of the rank that raised.
        other: the fingerprint of the peer it was compared with.
        differences: the aspects the report lists (``"op type"``, ``"tensor shapes"``,
            ``"tensor dtypes"``, ...), lower case.
    """

    this: Fingerprint
    other: Fingerprint
    differences: tuple[str, ...]


def _fingerprint(rank: int, text: str) -> Fingerprint:
    seq = _SEQ.search(text)
    if seq is None:
        raise ValueError(f"no SequenceNumber/OpType in fingerprint text {text[:120]!r}")
    shapes = _SHAPES.search(text)
    dims = re.findall(r"\[([\d, ]*)\]", shapes.group(1)) if shapes else []
    dtypes = _DTYPES.search(text)
    return Fingerprint(
        rank=rank,
        sequence_number=int(seq.group(1)),
        op=seq.group(2),
        shapes=tuple(tuple(int(d) for d in s.split(",") if d.strip()) for s in dims),
        dtypes=tuple(d.strip() for d in dtypes.group(1).split(",")) if dtypes else (),
    )


def parse_collective_mismatch(message: str) -> CollectiveMismatch | None:
    """Read a ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` mismatch error.

    Args:
        message: the text of the exception a rank raised (``str(exc)``).

    Returns:
        The report, or None when the message is not a collective-mismatch report (a timeout,
        for instance: what a rank raises when the checker is off).
    """
    if "Detected mismatch between collectives" not in message:
        return None
    starts = list(_RANK.finditer(message))
    if len(starts) < 2:
        return None
    body, _, tail = message.partition(_DIFF)
    first = body[starts[0].end() : starts[1].start()]
    second = body[starts[1].end() :]
    aspects = [a.split(":", 1)[0] for a in re.split(r"\s{2,}", tail.strip()) if ":" in a]
    differences = tuple(re.sub(r"^(tensor )+", "tensor ", a.strip().lower()) for a in aspects)
    return CollectiveMismatch(
        this=_fingerprint(int(starts[0].group(1)), first),
        other=_fingerprint(int(starts[1].group(1)), second),
        differences=differences,
    )
