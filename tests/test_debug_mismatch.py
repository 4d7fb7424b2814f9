"""``labkit.debug.mismatch`` on the messages torch 2.13's DETAIL checker raised on gloo.

The messages below are the ones ranks printed in ``tests/test_debug_detail.py``'s launches and
in notebook 19 (the ``TensorDeviceTypes`` part shortened; a report of an all_gather printed
``TensorShape=[2, 3]`` and ``CollectiveFingerPrint(SequenceNumber=0OpType=SCATTER)``, the two
variants tested last). tests/test_debug_detail.py checks live messages.
"""

from __future__ import annotations

import pytest

from labkit.debug import parse_collective_mismatch

DEV = "TensorOptions(dtype=float (default), device=cpu, layout=Strided (default))"
SHAPES = (
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    f"CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[3], "
    f"TensorDtypes=Float, TensorDeviceTypes={DEV}), but Rank 1 is running collective: "
    f"CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], "
    f"TensorDtypes=Float, TensorDeviceTypes={DEV}).Collectives differ in the following aspects: "
    "  Tensor Tensor shapes: 3vs 4"
)
OPS = (
    "Detected mismatch between collectives on ranks. Rank 1 is running collective: "
    f"CollectiveFingerPrint(SequenceNumber=1, OpType=BROADCAST, TensorShape=[4], "
    f"TensorDtypes=Float, TensorDeviceTypes={DEV}), but Rank 0 is running collective: "
    f"CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[4], "
    f"TensorDtypes=Float, TensorDeviceTypes={DEV}).Collectives differ in the following aspects: "
    "  Op type: BROADCASTvs ALLREDUCE"
)
DTYPES = (
    "Detected mismatch between collectives on ranks. Rank 0 is running collective: "
    f"CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], "
    f"TensorDtypes=Float, TensorDeviceTypes={DEV}), but Rank 1 is running collective: "
    f"CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], "
    f"TensorDtypes=Double, TensorDeviceTypes={DEV}).Collectives differ in the following "
    "aspects:   Tensor Tensor dtypes: Floatvs Double"
)


def test_shapes_of_both_ranks() -> None:
    m = parse_collective_mismatch(SHAPES)
    assert m is not None
    assert (m.this.rank, m.this.op, m.this.shapes, m.this.dtypes) == (
        0,
        "ALLREDUCE",
        ((3,),),
        ("Float",),
    )
    assert (m.other.rank, m.other.shapes, m.other.sequence_number) == (1, ((4,),), 0)
    assert m.differences == ("tensor shapes",)


def test_the_raising_rank_is_named_first() -> None:
    m = parse_collective_mismatch(OPS)
    assert (m.this.rank, m.this.op, m.other.rank, m.other.op) == (1, "BROADCAST", 0, "ALLREDUCE")
    assert m.this.sequence_number == m.other.sequence_number == 1
    assert m.differences == ("op type",)


def test_dtypes() -> None:
    m = parse_collective_mismatch(DTYPES)
    assert m.this.shapes == m.other.shapes == ((4,),)
    assert (m.this.dtypes, m.other.dtypes) == (("Float",), ("Double",))
    assert m.differences == ("tensor dtypes",)


def test_a_two_dimensional_shape() -> None:
    m = parse_collective_mismatch(SHAPES.replace("TensorShape=[4]", "TensorShape=[2, 3]"))
    assert m.other.shapes == ((2, 3),)


def test_a_fingerprint_without_tensors() -> None:
    text = SHAPES.replace(
        "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], "
        f"TensorDtypes=Float, TensorDeviceTypes={DEV})",
        "CollectiveFingerPrint(SequenceNumber=0OpType=SCATTER)",
    )
    m = parse_collective_mismatch(text)
    assert (m.other.op, m.other.shapes, m.other.dtypes) == ("SCATTER", (), ())


@pytest.mark.parametrize(
    "text",
    [
        "[../gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 2000ms for recv operation",
        "",
        "Detected mismatch between collectives on ranks. (and nothing else)",
    ],
)
def test_other_errors_are_not_mismatch_reports(text: str) -> None:
    assert parse_collective_mismatch(text) is None
