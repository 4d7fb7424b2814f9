"""What each rank says it is doing: collective descriptors, compared before any data is used.

Introduced in notebooks/04_custom_backend.ipynb.

With its first round of data every rank publishes a descriptor of the call: the collective
and its sequence number in the group, the facts every rank must agree on (dtype, number of
elements, reduce op, root) and the facts that must match pairwise (how many elements rank i
sends to rank j in an all-to-all). Before reading a peer's data, every rank compares all the
descriptors with the same function, so every rank raises the same error — "all_reduce #7:
rank 1 passed float32[12], rank 0 passed float32[10]" — at the same point of the protocol, and
the group stays usable. A rank whose own arguments are invalid still takes part, carrying its
error, so its peers do not wait for it until the timeout.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

KINDS = (
    "barrier",
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
)
KIND_CODE = {k: i + 1 for i, k in enumerate(KINDS)}
TENSOR_KEYS = ("dtype", "numel")  # a difference here is shown as the tensors passed


def kind_name(code: int) -> str:
    return KINDS[code - 1] if 0 < code <= len(KINDS) else f"unknown collective {code}"


class ArgumentError(ValueError):
    """A rank passed arguments the collective cannot accept (every rank raises it)."""


class MismatchError(RuntimeError):
    """Ranks called the same collective differently (every rank raises it)."""


@dataclass
class OpDesc:
    """One rank's description of the collective it is calling.

    Attributes:
        kind: the collective, one of ``KINDS``.
        seq: its number among this group's collectives, from 1.
        tensor: how error messages show this rank's tensor, e.g. ``float32[12]``.
        common: facts every rank must agree on, e.g. ``{"dtype": "float32", "numel": 12}``.
        sends: for all-to-all, elements this rank sends to each rank.
        recvs: for all-to-all, elements this rank expects from each rank.
        error: why this rank's own arguments are invalid ("" when they are fine).
    """

    kind: str
    seq: int
    tensor: str = ""
    common: dict = field(default_factory=dict)
    sends: list[int] = field(default_factory=list)
    recvs: list[int] = field(default_factory=list)
    error: str = ""

    def encode(self) -> bytes:
        fields = [self.kind, self.seq, self.tensor, self.common, self.sends, self.recvs]
        return json.dumps([*fields, self.error[:600]], separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> OpDesc:
        try:
            return cls(*json.loads(data))
        except (ValueError, TypeError):
            return cls("unreadable descriptor", -1)

    def label(self) -> str:
        return f"{self.kind} #{self.seq}"


def _show(d: OpDesc, keys: list[str]) -> str:
    parts = []
    if any(k in TENSOR_KEYS for k in keys) and d.tensor:
        parts.append(d.tensor)
    parts += [f"{k}={d.common.get(k)}" for k in keys if k not in TENSOR_KEYS or not d.tensor]
    return " ".join(parts)


def check_descriptors(descs: list[OpDesc]) -> None:
    """Raise the same error on every rank when the descriptors disagree; else return.

    Args:
        descs: every rank's descriptor, in rank order.

    Raises:
        ArgumentError: some rank's own arguments were invalid (all such ranks are named).
        MismatchError: ranks are at different collectives or passed different tensors,
            ops or roots, or all-to-all sizes that do not pair up.
    """
    ref = descs[0]
    for r, d in enumerate(descs):
        if d.seq != ref.seq:
            raise MismatchError(
                f"ranks are out of step: rank {r} is at collective #{d.seq} ({d.kind}), "
                f"rank 0 at #{ref.seq} ({ref.kind})"
            )
        if d.kind != ref.kind:
            raise MismatchError(
                f"collective #{ref.seq}: rank {r} called {d.kind}({d.tensor}), "
                f"rank 0 called {ref.kind}({ref.tensor}); every rank must call the same "
                "collectives in the same order"
            )
    bad = [(r, d.error) for r, d in enumerate(descs) if d.error]
    if bad:
        each = "; ".join(f"rank {r} passed invalid arguments: {e}" for r, e in bad)
        raise ArgumentError(f"{ref.label()}: {each}")
    for r, d in enumerate(descs):
        keys = [k for k in ref.common | d.common if d.common.get(k) != ref.common.get(k)]
        if keys:
            keys.sort(key=lambda k: (k not in TENSOR_KEYS, k))
            raise MismatchError(
                f"{ref.label()}: rank {r} passed {_show(d, keys)}, rank 0 passed {_show(ref, keys)}"
                f" (every rank must pass the same {', '.join(keys)})"
            )
    if ref.kind in ("all_to_all", "all_to_all_single"):
        for i, di in enumerate(descs):
            for j, dj in enumerate(descs):
                if di.sends[j] != dj.recvs[i]:
                    raise MismatchError(
                        f"{ref.label()}: rank {i} sends {di.sends[j]} element(s) to rank {j}, "
                        f"but rank {j} expects {dj.recvs[i]} from rank {i}"
                    )
