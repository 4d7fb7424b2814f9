"""PyTorch's flight recorder: each rank's last collectives, dumped, read back and compared.

Introduced in notebooks/19_fault_tolerance.ipynb (section 5, debugging a distributed job).

Process groups record the collectives they issue in a ring buffer of ``TORCH_FR_BUFFER_SIZE``
entries (older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``; torch 2.13's ``FlightRecorder.hpp`` reads
both, default 2000; 0 turns it off): the operation (``profiling_name``, e.g.
``"gloo:all_reduce"``), the input and output sizes, the group, a sequence number per group
(``collective_seq_id``), a state and the Python stack that issued it. On NCCL the watchdog
writes every rank's buffer to ``TORCH_FR_DUMP_TEMP_FILE<rank>`` (older name
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) when a collective times out and
``TORCH_NCCL_DUMP_ON_TIMEOUT=1``; ``torchfrtrace <folder>`` then matches the ranks' entries.
What of this works on gloo is measured in notebook 19; where the watchdog does not write the
dump, a rank writes its own with ``dump_flight_recorder`` (the same file layout and name), and
``compare_ranks`` answers the question a hang asks: which rank stopped at which collective.

Dumps are pickles (as torch writes them): load only dumps you or your job wrote.
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FrEntry:
    """One recorded operation.

    Attributes:
        group: the process group's name in the dump (``"0"`` is the default group).
        seq: ``collective_seq_id``, the collective's number in its group (from 1).
        op: ``profiling_name``: backend and operation, ``"gloo:all_reduce"``.
        input_sizes: the shape of each input tensor.
        state: ``"scheduled"``, ``"started"`` or ``"completed"``, as the backend reported it.
        is_p2p: a send/recv (which counts ``p2p_seq_id`` instead of ``seq``).
    """

    group: str
    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    state: str
    is_p2p: bool = False


@dataclass(frozen=True)
class RankPosition:
    """Where one rank was in one group: its last recorded collective.

    Attributes:
        rank: the rank. group: the group's name. seq: the last collective's number (0: none).
        op: its ``profiling_name`` ("" when none). input_sizes: its input shapes.
    """

    rank: int
    group: str
    seq: int
    op: str
    input_sizes: tuple[tuple[int, ...], ...]


def dump_flight_recorder(prefix: str | os.PathLike, rank: int, backend: str = "gloo") -> Path:
    """Write this process's flight recorder buffer to ``<prefix><rank>``, as NCCL's watchdog does.

    Args:
        prefix: the file name prefix (``TORCH_FR_DUMP_TEMP_FILE``'s role), e.g.
            ``"/tmp/fr/rank_"``; its folder is created.
        rank: this process's rank (the file name's suffix).
        backend: ``"nccl"`` dumps NCCL's recorder (``_dump_nccl_trace``, CUDA builds only);
            anything else the recorder of the other backends (``_dump_fr_trace``).

    Returns:
        The file written (a pickle of the recorder's dict: ``version``, ``entries``,
        ``pg_config``, ``pg_status``, ...).

    Raises:
        RuntimeError: ``backend="nccl"`` in a build without NCCL.
    """
    import torch._C._distributed_c10d as c10d

    if backend == "nccl":
        if not hasattr(c10d, "_dump_nccl_trace"):
            raise RuntimeError("this torch build has no NCCL flight recorder (_dump_nccl_trace)")
        data = c10d._dump_nccl_trace()
    else:
        data = c10d._dump_fr_trace()
    path = Path(f"{os.fspath(prefix)}{rank}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def load_flight_recorder(path: str | os.PathLike) -> dict:
    """Read one dump (a pickle written by torch or by ``dump_flight_recorder``).

    Args:
        path: the file.

    Returns:
        The recorder's dict.
    """
    return pickle.loads(Path(path).read_bytes())


def load_flight_recorders(folder: str | os.PathLike, prefix: str = "rank_") -> dict[int, dict]:
    """Read every rank's dump in a folder, named ``<prefix><rank>``.

    Args:
        folder: the folder.
        prefix: the common file name prefix.

    Returns:
        ``{rank: dump}``, in rank order.
    """
    out = {}
    for path in Path(folder).glob(f"{prefix}*"):
        suffix = path.name[len(prefix) :]
        if suffix.isdigit():
            out[int(suffix)] = load_flight_recorder(path)
    return dict(sorted(out.items()))


def fr_entries(dump: dict) -> list[FrEntry]:
    """The entries of one dump, oldest first.

    Args:
        dump: a recorder dict (``load_flight_recorder``).

    Returns:
        One ``FrEntry`` per recorded operation.
    """
    return [
        FrEntry(
            group=str(e["process_group"][0]),
            seq=int(e["collective_seq_id"]),
            op=str(e["profiling_name"]),
            input_sizes=tuple(tuple(s) for s in e.get("input_sizes", [])),
            state=str(e.get("state", "")),
            is_p2p=bool(e.get("is_p2p", False)),
        )
        for e in dump.get("entries", [])
    ]


def compare_ranks(dumps: dict[int, dict]) -> dict[str, dict[int, RankPosition]]:
    """Each rank's last collective in each group: the ranks behind are where a hang starts.

    A rank whose last collective number is lower than its peers' never issued the collective
    they wait in (or its buffer wrapped around: keep ``TORCH_FR_BUFFER_SIZE`` large enough).

    Args:
        dumps: ``{rank: dump}`` (``load_flight_recorders``).

    Returns:
        ``{group: {rank: RankPosition}}``; a rank that recorded nothing in a group where its
        peers did is listed with ``seq=0`` (every dumped rank is taken to be in every group:
        gloo's dumps do not say who is, ``pg_config`` is empty there).
    """
    last: dict[str, dict[int, RankPosition]] = {}
    for rank, dump in dumps.items():
        for e in fr_entries(dump):
            if e.is_p2p:
                continue
            last.setdefault(e.group, {})[rank] = RankPosition(
                rank, e.group, e.seq, e.op, e.input_sizes
            )
    for group, ranks in last.items():
        for rank in dumps:
            ranks.setdefault(rank, RankPosition(rank, group, 0, "", ()))
        last[group] = dict(sorted(ranks.items()))
    return last


def behind(positions: dict[int, RankPosition]) -> list[int]:
    """The ranks of one group whose last collective is older than the newest any rank issued.

    Args:
        positions: ``compare_ranks(...)[group]``.

    Returns:
        Those ranks, in order (empty when all agree).
    """
    newest = max((p.seq for p in positions.values()), default=0)
    return [r for r, p in positions.items() if p.seq < newest]


def describe_positions(positions: dict[str, dict[int, RankPosition]]) -> list[str]:
    """One readable line per rank and group, marking the ranks that are behind.

    Args:
        positions: ``compare_ranks(...)``.

    Returns:
        Lines such as ``"group 1: rank 1 last issued #2 gloo:all_reduce [[3]]  <- behind"``.
    """
    lines = []
    for group, ranks in positions.items():
        late = set(behind(ranks))
        for rank, p in ranks.items():
            sizes = [list(s) for s in p.input_sizes]
            mark = "  <- behind: never issued the next one" if rank in late else ""
            lines.append(f"group {group}: rank {rank} last issued #{p.seq} {p.op} {sizes}{mark}")
    return lines
