"""What every all-reduce algorithm shares: the reduction op, input checks, the flat buffer.

Introduced in notebooks/03_allreduce_algorithms.ipynb.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist

from labkit.backends._pg_util import reduce_op_name
from labkit.collectives.counting import P2P

__all__ = [
    "OPS",
    "check_same_input",
    "combine_",
    "finish_",
    "flat_view",
    "op_name",
    "prepare",
    "run_allreduce",
]

OPS = ("sum", "product", "min", "max", "avg")  # the ops these algorithms implement


def op_name(op: Any) -> str:
    """The name of a reduction op these algorithms implement (read by ``reduce_op_name``).

    Args:
        op: ``dist.ReduceOp.SUM`` (a ``RedOpType``), ``dist.ReduceOp(...)``, or a name such
            as ``"sum"`` / ``"max"``.

    Returns:
        One of ``OPS``.

    Raises:
        ValueError: an op these algorithms do not implement (e.g. BAND, PREMUL_SUM).
    """
    name = reduce_op_name(op)
    if name not in OPS:
        raise ValueError(f"unsupported reduction op {op!r}; use one of {', '.join(OPS)}")
    return name


def combine_(dst: torch.Tensor, other: torch.Tensor, op: str, other_first: bool = False) -> None:
    """``dst ← op(dst, other)`` in place (``op(other, dst)`` when ``other_first``).

    The operand order is fixed so that two ranks combining the same pair of values get the
    same bits (recursive doubling relies on it). AVG combines as SUM; ``finish_`` divides.

    Args:
        dst: the accumulator, overwritten.
        other: the values received; same shape as ``dst``.
        op: one of ``OPS``.
        other_first: put ``other`` as the left operand.

    Returns:
        None.

    Raises:
        ValueError: ``op`` is not one of ``OPS``.
    """
    a, b = (other, dst) if other_first else (dst, other)
    if op in ("sum", "avg"):
        torch.add(a, b, out=dst)
    elif op == "product":
        torch.mul(a, b, out=dst)
    elif op == "min":
        torch.minimum(a, b, out=dst)
    elif op == "max":
        torch.maximum(a, b, out=dst)
    else:
        raise ValueError(f"unsupported reduction op {op!r}; use one of {', '.join(OPS)}")


def finish_(tensor: torch.Tensor, op: str, world_size: int) -> None:
    """Turn a SUM into the AVG (``tensor /= world_size``) when ``op`` is ``"avg"``.

    Args:
        tensor: the summed values, divided in place when ``op == "avg"``.
        op: one of ``OPS``.
        world_size: the number of ranks whose tensors were summed.

    Returns:
        None.

    Raises:
        RuntimeError: from torch, when an integer tensor would need a fractional result.
    """
    if op == "avg":
        tensor.div_(world_size)


@contextmanager
def flat_view(tensor: torch.Tensor) -> Iterator[torch.Tensor]:
    """A 1-D contiguous buffer for ``tensor``; written back on exit if it had to be a copy.

    Args:
        tensor: any tensor; send/recv need contiguous memory, so a non-contiguous one is
            copied in and out.

    Returns:
        A context manager yielding the 1-D buffer (a view of ``tensor`` when contiguous).

    Raises:
        Nothing of its own; exceptions from the block propagate (no write-back then).
    """
    if tensor.is_contiguous():
        yield tensor.view(-1)
        return
    flat = tensor.contiguous().view(-1)  # a copy: send/recv need contiguous memory
    yield flat
    tensor.copy_(flat.view(tensor.shape))


def _describe(shape: tuple[int, ...], dtype: str, op: str) -> str:
    return f"shape {shape}, {dtype}, op {op}"


def check_same_input(tensor: torch.Tensor, op: str, group: dist.ProcessGroup | None) -> None:
    """Raise the same ``ValueError`` on every rank when the ranks' inputs disagree.

    Costs one all-gather of one int64 per rank (a checksum of shape, dtype and op); only when
    they differ does a second all-gather fetch the details for the message. Without it, ranks
    with different sizes would wait for each other's messages forever.

    Args:
        tensor: this rank's input.
        op: the op name this rank was given.
        group: the process group (default: the default group).

    Returns:
        None.

    Raises:
        ValueError: shapes, dtypes or ops differ between ranks; the message names the ranks.
    """
    p = dist.get_world_size(group)
    if p == 1:
        return
    desc = (tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."), op)
    mine = torch.tensor([zlib.crc32(repr(desc).encode())], dtype=torch.int64)
    mine = mine.to(tensor.device)
    gathered = [torch.empty_like(mine) for _ in range(p)]
    dist.all_gather(gathered, mine, group=group)
    if all(torch.equal(g, gathered[0]) for g in gathered):
        return
    descs: list[Any] = [None] * p
    dist.all_gather_object(descs, desc, group=group)
    by_desc: dict[tuple, list[int]] = {}
    for rank, d in enumerate(descs):
        by_desc.setdefault(tuple(d), []).append(rank)
    parts = []
    for d, ranks in by_desc.items():
        who = "rank" if len(ranks) == 1 else "ranks"
        parts.append(f"{who} {', '.join(map(str, ranks))}: {_describe(*d)}")
    raise ValueError(
        "all-reduce inputs differ across the ranks of the group ("
        + "; ".join(parts)
        + "). Every rank must pass a tensor of the same shape and dtype, with the same op."
    )


def prepare(
    tensor: torch.Tensor, op: Any, group: dist.ProcessGroup | None, check: bool = True
) -> str:
    """Validate the call of an all-reduce algorithm on this rank; return the op's name.

    Args:
        tensor: the input, reduced in place afterwards.
        op: a ``dist.ReduceOp``-like op or its name.
        group: the process group (default: the default group).
        check: compare shape, dtype and op across ranks first (``check_same_input``).

    Returns:
        The op's name, one of ``OPS``.

    Raises:
        TypeError: ``tensor`` is not a tensor, or AVG of an integer tensor (like PyTorch,
            which refuses to cast the mean back to an integer dtype).
        ValueError: an unsupported op, or inputs that differ across ranks.
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    name = op_name(op)
    if check:
        check_same_input(tensor, name, group)
    if name == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(
            f"ReduceOp.AVG needs a floating-point tensor, got {tensor.dtype}: the mean of "
            "integers is not an integer (dist.all_reduce refuses it too); use SUM and divide"
        )
    return name


def run_allreduce(
    tensor: torch.Tensor,
    op: Any,
    group: dist.ProcessGroup | None,
    check: bool,
    algorithm: Callable[[P2P, torch.Tensor, str], None],
) -> None:
    """Run an all-reduce ``algorithm`` on ``tensor`` in place, after the checks all of them make.

    The call is validated (``prepare``), then ``algorithm(p2p, flat, name)`` reduces ``flat`` —
    ``tensor`` as one contiguous 1-D buffer, written back if it had to be a copy — over the
    group, sending through ``p2p`` (so the messages are counted) and dividing for AVG itself
    (``finish_``), where its structure says.

    Args:
        tensor: this rank's input; holds the reduction over the group afterwards.
        op: a ``dist.ReduceOp``-like op or its name.
        group: the process group (default: the default group).
        check: compare shape, dtype and op across ranks first (``check_same_input``).
        algorithm: the algorithm on the flat buffer, given the op's name.

    Returns:
        None; ``tensor`` is modified in place, like ``dist.all_reduce``.

    Raises:
        ValueError: unsupported op, or inputs that differ across ranks (on every rank).
        TypeError: AVG of an integer tensor.
    """
    name = prepare(tensor, op, group, check)
    p2p = P2P(group)
    with flat_view(tensor) as flat:
        algorithm(p2p, flat, name)
