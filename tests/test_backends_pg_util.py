"""labkit.backends._pg_util: reduce ops and dtypes, reductions equal to a single-process
reference, Work objects that DDP can read, and the naming a Python ProcessGroup needs.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from labkit.backends import _pg_util as pgu
from tests.shm_cases import DTYPES, Case, make_input, mismatch, ops_for, reference_reduce

R = dist.ReduceOp


@pytest.mark.parametrize(
    ("op", "name"),
    [(R.SUM, "sum"), (R.AVG, "avg"), (R.PRODUCT, "product"), (R.MIN, "min"), (R.MAX, "max")]
    + [(R.BAND, "band"), (R.BOR, "bor"), (R.BXOR, "bxor")],
)
def test_reduce_op_name_reads_every_form(op, name):
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    assert pgu.reduce_op_name(opts.reduceOp) == name  # the object c10d hands a backend
    assert pgu.reduce_op_name(op) == name
    assert pgu.reduce_op_name(opts.reduceOp.op) == name  # the RedOpType inside it


def test_premul_sum_is_named_and_refused_naming_the_supported_ops():
    name = pgu.reduce_op_name(dist._make_nccl_premul_sum(0.5))
    assert name == "premul_sum"
    error = pgu.reduction_error(name, torch.float32)
    assert (
        "unsupported reduce op PREMUL_SUM: supported are SUM, AVG, PRODUCT, MIN, MAX, BAND" in error
    )


def test_reduce_op_names_may_be_strings():
    assert pgu.reduce_op_name("PROD") == "product" and pgu.reduce_op_name("mean") == "avg"


@pytest.mark.parametrize(
    ("op", "dtype", "text"),
    [
        ("sum", torch.uint16, "cannot reduce uint16 tensors: supported dtypes are float32"),
        ("sum", torch.complex64, "cannot reduce complex64"),
        ("avg", torch.int64, "ReduceOp.AVG needs a floating-point dtype, got int64"),
        ("avg", torch.bool, "ReduceOp.AVG needs a floating-point dtype, got bool"),
        ("bor", torch.float16, "ReduceOp.BOR needs an integer or bool dtype, got float16"),
    ],
)
def test_reduction_error_says_what_is_supported(op, dtype, text):
    assert text in pgu.reduction_error(op, dtype)
    with pytest.raises(ValueError, match=text.split(":")[0]):
        pgu.reduce_rows(torch.zeros(2, 3, dtype=dtype), op, torch.zeros(3, dtype=dtype))


def test_every_supported_pair_has_no_error():
    for dt in DTYPES:
        for op in ops_for(dt):
            assert pgu.reduction_error(op, dt) is None, (op, dt)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_rows_and_reduce_into_row_equal_the_reference(dtype, n):
    for op in ops_for(dtype):
        case = Case("unit", dtype, 37, op)
        xs = [make_input(case, r) for r in range(n)]
        want = reference_reduce(op, xs)
        out = torch.empty(37, dtype=dtype)
        assert mismatch(pgu.reduce_rows(torch.stack(xs), op, out), want, op) is None
        assert mismatch(pgu.reduce_rows(xs, op, torch.empty_like(out)), want, op) is None
        keep = n // 2
        rows = torch.stack(xs)
        got = pgu.reduce_into_row(rows, keep, op)
        assert mismatch(got, want, f"{op} into row {keep}") is None
        for r in range(n):
            if r != keep:
                assert torch.equal(rows[r], xs[r]), "reduce_into_row wrote another row"


def test_reduce_rows_wraps_integers_and_treats_bool_as_logic():
    big = torch.tensor([[100, 3], [101, 4]], dtype=torch.int8)
    assert pgu.reduce_rows(big, "sum", torch.empty(2, dtype=torch.int8)).tolist() == [-55, 7]
    b = torch.tensor([[True, False, True], [False, False, True]])
    out = torch.empty(3, dtype=torch.bool)
    assert pgu.reduce_rows(b, "sum", out).tolist() == [True, False, True]  # OR
    assert pgu.reduce_rows(b, "product", out).tolist() == [False, False, True]  # AND
    assert pgu.reduce_rows(b, "bxor", out).tolist() == [True, False, False]


def test_describe_shows_dtype_and_shape():
    assert pgu.describe(torch.zeros(3, 4)) == "float32[3, 4]"
    assert pgu.describe(torch.zeros((), dtype=torch.int8)) == "int8[]"
    assert pgu.dtype_name(torch.bfloat16) == "bfloat16"


def test_completed_work_hands_its_result_to_the_future():
    t = torch.ones(3)
    work = pgu.completed_work([t])
    assert work.wait() and work.is_completed()
    assert work.get_future().value()[0] is t


def test_future_work_finishes_from_another_thread_and_reports_its_source():
    work = pgu.FutureWork()
    assert not work.is_completed()
    t = torch.zeros(2)
    threading.Thread(target=lambda: (time.sleep(0.05), work.complete([t], 3))).start()
    assert work.wait() and work.is_completed() and work.is_success()
    assert work._source_rank() == 3 and work.result()[0] is t and work.exception() is None


def test_future_work_failure_raises_at_wait():
    work = pgu.FutureWork()
    work.fail(RuntimeError("rank 1 is gone"))
    with pytest.raises(RuntimeError, match="rank 1 is gone"):
        work.wait()
    assert not work.is_success() and "gone" in str(work.exception())


class _OneRank(pgu.PythonProcessGroup):
    """A one-rank group: each primitive copies input to output, to check the aliases."""

    def __init__(self) -> None:
        super().__init__(0, 1, "one_rank")
        self.calls: list[str] = []

    def all_gather_single(self, output, input, opts=None):  # noqa: A002
        self.calls.append("all_gather_single")
        output.copy_(input)
        return pgu.completed_work([output])

    def reduce_scatter_single(self, output, input, opts=None):  # noqa: A002
        self.calls.append("reduce_scatter_single")
        output.copy_(input)
        return pgu.completed_work([output])

    def allreduce(self, tensors, opts=None):
        self.calls.append(f"allreduce:{pgu.reduce_op_name(opts.reduceOp)}")
        return pgu.completed_work(tensors)

    def allgather(self, output_tensors, input_tensors, opts=None):
        self.calls.append("allgather")
        output_tensors[0][0].copy_(input_tensors[0])
        return pgu.completed_work(output_tensors)


def test_python_group_keeps_its_name_and_forwards_the_aliases():
    pg = _OneRank()
    pg._set_group_name("7")
    assert pg.group_name == "7" and pg.getBackendName() == "one_rank"
    outs, ins = [torch.empty(2), torch.empty(3)], [torch.ones(2), torch.full((3,), 2.0)]
    pg.allgather_into_tensor_coalesced(outs, ins).wait()
    pg.reduce_scatter_tensor_coalesced(outs, ins).wait()
    pg._allgather_base(outs[0], ins[0])
    opts = dist.AllreduceCoalescedOptions()
    opts.reduceOp = R.MAX
    pg.allreduce_coalesced([torch.ones(1), torch.ones(2)], opts).wait()
    lists = [[torch.empty(2)]]
    pg.allgather_coalesced(lists, [torch.ones(2)]).wait()
    assert outs[1].tolist() == [2.0, 2.0, 2.0] and lists[0][0].tolist() == [1.0, 1.0]
    assert pg.calls == [
        "all_gather_single",
        "all_gather_single",
        "reduce_scatter_single",
        "reduce_scatter_single",
        "all_gather_single",
        "allreduce:max",
        "allreduce:max",
        "allgather",
    ]
