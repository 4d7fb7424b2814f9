"""Checks across the ranks of a job: the same software on every rank, a directory all ranks see.

Introduced in notebooks/00_setup_and_launcher.ipynb.

Every node of a job must run the same torch, CUDA and NCCL: mixed versions are a configuration
nobody tests, and what goes wrong shows far from the cause. A checkpoint directory that is local
to each node makes rank 0's files invisible to the other nodes, which shows only when a restart
finds nothing to resume from. Both are cheap to check at the start of a job, with the job's own
process group:

    lk.check_versions()            # every rank: raises VersionMismatch naming the odd ranks
    lk.check_shared_dir("/ckpt")   # every rank: raises SharedDirError naming who cannot see it

Both are collectives: every rank of ``group`` must call them, in the same order. They use
``dist.all_gather_object``, which on NCCL moves its bytes through
``torch.cuda.current_device()``: set each rank's device first (``lk.launch`` and the lab
scripts do). ``labkit doctor`` runs the version check when started under ``torchrun``.
"""

from __future__ import annotations

import os
import platform
import socket
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = [
    "FIELDS",
    "RankVersions",
    "SharedDirError",
    "VersionMismatch",
    "check_shared_dir",
    "check_versions",
    "local_versions",
]

FIELDS = ("torch", "cuda", "nccl", "python", "labkit")  # what must agree on every rank
FIX = (
    "install the same pinned versions on every node (`pip install -r requirements.txt` in the "
    "same Python, or run every node from the same Docker image), then restart the job"
)


class VersionMismatch(RuntimeError):
    """Ranks of one job run different software; the message names them and their hosts."""


class SharedDirError(RuntimeError):
    """Some ranks cannot see a file that rank 0 wrote; the message names them and their hosts."""


@dataclass(frozen=True)
class RankVersions:
    """What one rank runs.

    Attributes:
        rank: the rank in the group checked.
        host: ``socket.gethostname()`` of its machine.
        torch: ``torch.__version__``, e.g. ``"2.13.0+cu130"``.
        cuda: the CUDA runtime torch was built with (``torch.version.cuda``), "none" on CPU.
        nccl: ``torch.cuda.nccl.version()`` as text, "none" where NCCL is not available.
        python: ``platform.python_version()``.
        labkit: ``labkit.__version__``.
    """

    rank: int
    host: str
    torch: str
    cuda: str
    nccl: str
    python: str
    labkit: str


def _nccl_version() -> str:
    if not dist.is_nccl_available():
        return "none"
    # torch.cuda.nccl.version() asks the NCCL library linked into torch; no CUDA context.
    return ".".join(str(v) for v in torch.cuda.nccl.version())


def local_versions(rank: int = 0) -> RankVersions:
    """The versions this process runs (no communication; does not initialise CUDA).

    Args:
        rank: the rank to record them under.

    Returns:
        A :class:`RankVersions` for this process.
    """
    import labkit

    return RankVersions(
        rank=rank,
        host=socket.gethostname() or platform.node() or "unknown host",
        torch=torch.__version__,
        cuda=torch.version.cuda or "none",
        nccl=_nccl_version(),
        python=platform.python_version(),
        labkit=labkit.__version__,
    )


def _where(rows: list[RankVersions]) -> str:
    ranks = ", ".join(str(r.rank) for r in rows)
    hosts = ", ".join(sorted({r.host for r in rows}))
    return f"rank{'s' if len(rows) > 1 else ''} {ranks} (on {hosts})"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def mismatch_message(rows: list[RankVersions], fields: tuple[str, ...] = FIELDS) -> str | None:
    """Describe where ``rows`` disagree, or return None when every field agrees.

    Args:
        rows: one :class:`RankVersions` per rank, in rank order.
        fields: the attributes compared.

    Returns:
        For each differing field, each value with the ranks and hosts that have it, then the
        ranks that differ from rank 0 and what to do; None when all agree.
    """
    lines = []
    odd: set[int] = set()
    for name in fields:
        by_value: dict[str, list[RankVersions]] = {}
        for row in rows:
            by_value.setdefault(getattr(row, name), []).append(row)
        if len(by_value) == 1:
            continue
        reference = getattr(rows[0], name)
        parts = [f"{value!r} on {_where(group)}" for value, group in by_value.items()]
        lines.append(f"  {name}: " + "; ".join(parts))
        odd.update(r.rank for r in rows if getattr(r, name) != reference)
    if not lines:
        return None
    differ = [r for r in rows if r.rank in odd]
    return (
        f"ranks run different software ({len(rows)} ranks checked):\n"
        + "\n".join(lines)
        + f"\n{_capital(_where(differ))} {'differ' if len(differ) > 1 else 'differs'} from "
        f"rank 0. Every node must run the same torch, CUDA and NCCL: {FIX}."
    )


def check_versions(
    group: dist.ProcessGroup | None = None, fields: tuple[str, ...] = FIELDS
) -> list[RankVersions]:
    """Gather every rank's versions and fail if any differ (a collective: call it on every rank).

    Args:
        group: the process group to check (default: the default group).
        fields: which of torch, cuda, nccl, python, labkit must agree.

    Returns:
        Every rank's :class:`RankVersions`, in group-rank order (the same on every rank).

    Raises:
        VersionMismatch: on every rank, when any field differs; the message names each value
            with its ranks and hosts, and what to do.
        ValueError: ``fields`` names something that is not a :class:`RankVersions` field.
    """
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; choose from {FIELDS}")
    mine = local_versions(dist.get_rank(group))
    gathered: list[dict | None] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, asdict(mine), group=group)
    rows = [RankVersions(**row) for row in gathered if row is not None]
    message = mismatch_message(rows, fields)
    if message is not None:
        raise VersionMismatch(message)
    return rows


@dataclass(frozen=True)
class SharedDirResult:
    """What each rank saw of rank 0's file.

    Attributes:
        path: the directory checked (as rank 0 named it).
        hosts: each rank's host, in group-rank order.
        seen: each rank's verdict: "ok", or what went wrong ("no such file", ...).
    """

    path: str
    hosts: list[str]
    seen: list[str]

    @property
    def ok(self) -> bool:
        """True when every rank read back exactly what rank 0 wrote."""
        return all(s == "ok" for s in self.seen)


def _write_probe(directory: Path, token: str) -> str:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".labkit-shared-{token}.tmp"
        tmp.write_text(token)
        os.replace(tmp, directory / f".labkit-shared-{token}")  # appears whole or not at all
        return "ok"
    except OSError as exc:
        return f"rank 0 could not write there: {exc}"


def _read_probe(directory: Path, token: str) -> str:
    try:
        text = (directory / f".labkit-shared-{token}").read_text()
    except FileNotFoundError:
        return "no such file: this rank's directory is not rank 0's"
    except OSError as exc:
        return f"cannot read it: {exc}"
    return "ok" if text == token else f"read {text[:40]!r}, not what rank 0 wrote"


def check_shared_dir(
    path: str | os.PathLike, group: dist.ProcessGroup | None = None
) -> SharedDirResult:
    """Check that every rank sees the same directory: rank 0 writes a file, every rank reads it.

    A collective: call it on every rank of ``group`` with the same path. Rank 0 creates the
    directory if needed, writes a file with a random token (atomically: a temporary name,
    then ``os.replace``), every rank reads it back and compares, and rank 0 removes it again.

    Args:
        path: the directory the job will write checkpoints to.
        group: the process group to check (default: the default group).

    Returns:
        A :class:`SharedDirResult` (``ok`` is True) on every rank.

    Raises:
        SharedDirError: on every rank, when any rank cannot read back rank 0's file; the message
            names those ranks, their hosts and what each saw.
    """
    directory = Path(path)
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    host = socket.gethostname() or "unknown host"
    token = uuid.uuid4().hex
    written = _write_probe(directory, token) if rank == 0 else "ok"
    step1: list[tuple | None] = [None] * size
    dist.all_gather_object(step1, (token, written, str(path)), group=group)  # also a barrier
    token, written, named = step1[0]  # rank 0's
    seen = written if written != "ok" else _read_probe(directory, token)
    step2: list[tuple | None] = [None] * size
    dist.all_gather_object(step2, (host, seen), group=group)  # nobody reads after this
    if rank == 0 and written == "ok":
        (directory / f".labkit-shared-{token}").unlink(missing_ok=True)
    result = SharedDirResult(named, [h for h, _ in step2], [s for _, s in step2])
    if not result.ok:
        bad = [r for r, s in enumerate(result.seen) if s != "ok"]
        lines = [f"  rank {r} on {result.hosts[r]}: {result.seen[r]}" for r in bad]
        raise SharedDirError(
            f"{len(bad)} of {size} ranks cannot see the file rank 0 (on {result.hosts[0]}) "
            f"wrote to {named}:\n"
            + "\n".join(lines)
            + "\nCheckpoints written there by one rank would be invisible to these ranks: "
            "use a directory on storage every node mounts at the same path (NFS, Lustre, a "
            "cloud bucket mounted with the same name)."
        )
    return result


def job_checks(shared_dir: str | None = None, group: dist.ProcessGroup | None = None) -> list:
    """The doctor's cross-rank checks, as report lines (a collective: every rank calls it).

    Args:
        shared_dir: also check that every rank sees this directory (None: skip).
        group: the process group (default: the default group).

    Returns:
        list[Check]: "versions" (and "shared dir"), the same verdict on every rank.
    """
    from labkit.preflight.checks import Check

    size = dist.get_world_size(group)
    try:
        rows = check_versions(group)
        v = rows[0]
        hosts = len({r.host for r in rows})
        checks = [
            Check(
                "versions",
                "ok",
                f"{size} ranks on {hosts} host(s) agree: torch {v.torch}, CUDA {v.cuda}, "
                f"NCCL {v.nccl}, Python {v.python}, labkit {v.labkit}",
            )
        ]
    except VersionMismatch as exc:
        checks = [Check("versions", "fail", str(exc).split("\nEvery node")[0], FIX)]
    if shared_dir is not None:
        try:
            result = check_shared_dir(shared_dir, group)
            hosts = len(set(result.hosts))
            detail = f"all {size} ranks on {hosts} host(s) read rank 0's file in {shared_dir}"
            checks.append(Check("shared dir", "ok", detail))
        except SharedDirError as exc:
            head, _, fix = str(exc).partition("\nCheckpoints")
            checks.append(Check("shared dir", "fail", head, "Checkpoints" + fix))
    return checks
