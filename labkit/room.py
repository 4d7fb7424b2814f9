"""GPUs for a workshop room: which learner's server gets which GPUs of the box.

Introduced in docker/room/README.md (the room's hub calls it for every server it starts) and
notebooks/00_setup_and_launcher.ipynb, where ``lk.doctor()`` says what the room gave you.

Pure arithmetic over names, no processes and no torch: the hub's configuration
(docker/room/jupyterhub_config.py) loads this file on its own, without the rest of labkit, so it
must import nothing but the standard library.

The rule, in order:

1. a *table* (``{"alice": ["0", "1"]}``) gives named learners exactly those GPUs;
2. the GPUs no table entry holds are dealt to the other learners in blocks of ``per_learner``,
   in the learners' order (the room's roster, or the order they first logged in): with 8 GPUs,
   4 learners × 2 or 8 × 1; neighbouring ids share a block, as they usually share a PCIe
   switch or NVLink;
3. a learner for whom no whole block is left runs on the CPU, and is told so.

Appending a learner never moves an earlier one: the seats of ``learners[:k]`` are the same in
``assign_gpus(learners[:k], ...)`` and ``assign_gpus(learners, ...)``, so the hub can assign
as learners arrive. No GPU is ever given to two learners (NCCL cannot share one between ranks,
and two kernels filling one GPU's memory fail each other).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "Seat",
    "assign_gpus",
    "device_requests",
    "per_learner_for",
    "seat_env",
    "parse_table",
]

# What the hub writes into every learner's server environment; lk.doctor() reads it back.
ENV_LEARNER = "LABKIT_ROOM_LEARNER"
ENV_GPUS = "LABKIT_ROOM_GPUS"
ENV_NOTE = "LABKIT_ROOM_NOTE"


@dataclass(frozen=True)
class Seat:
    """One learner's share of the box.

    Attributes:
        learner: the learner's name (the hub's user name).
        gpu_ids: the host's GPU ids given to this learner (``nvidia-smi``'s indices, or UUIDs),
            empty for a CPU-only seat.
        how: ``"table"``, ``"dealt"``, ``"gpus ran out"`` or ``"no gpus"``.
        note: one sentence for the learner, printed by ``lk.doctor()``.
    """

    learner: str
    gpu_ids: tuple[str, ...]
    how: str
    note: str

    @property
    def cpu_only(self) -> bool:
        """True when this learner has no GPU."""
        return not self.gpu_ids


def per_learner_for(n_gpus: int, room_size: int) -> int:
    """GPUs per learner when ``n_gpus`` are shared evenly by ``room_size`` learners.

    Args:
        n_gpus: GPUs on the box.
        room_size: learners expected.

    Returns:
        ``n_gpus // room_size``, at least 1 when there is any GPU (the first ``n_gpus``
        learners then get one each and the rest run on the CPU), 0 without GPUs.

    Raises:
        ValueError: a negative GPU count or a room of fewer than one learner.
    """
    if n_gpus < 0 or room_size < 1:
        raise ValueError(f"n_gpus={n_gpus} must be >= 0 and room_size={room_size} >= 1")
    return max(1, n_gpus // room_size) if n_gpus else 0


def _check_table(table: Mapping[str, Sequence[str]], gpu_ids: Sequence[str]) -> None:
    owner: dict[str, str] = {}
    for learner, ids in table.items():
        for gpu in ids:
            if gpu not in gpu_ids:
                raise ValueError(
                    f"the GPU table gives {learner} GPU {gpu!r}, which the box does not have "
                    f"(its GPUs: {', '.join(gpu_ids) or 'none'})"
                )
            if gpu in owner:
                raise ValueError(
                    f"the GPU table gives GPU {gpu!r} to both {owner[gpu]} and {learner}: "
                    "a GPU serves one learner"
                )
            owner[gpu] = learner


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def assign_gpus(
    learners: Sequence[str],
    gpu_ids: Sequence[str],
    per_learner: int = 1,
    table: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Seat]:
    """Give each learner their GPUs (the module docstring has the rule).

    Args:
        learners: the learners in a stable order (roster, or order of first login).
        gpu_ids: the box's GPUs as Docker's ``device_ids`` name them (``["0", ..., "7"]``).
        per_learner: GPUs for each learner not in the table (ignored without GPUs).
        table: learner -> GPU ids, given first and exactly; the others share the rest.

    Returns:
        learner -> :class:`Seat`, for every name in ``learners``.

    Raises:
        ValueError: ``per_learner`` < 1 while there are GPUs, a learner named twice, or a
            table that names a GPU the box does not have, or one GPU for two learners.
    """
    gpu_ids = [str(g) for g in gpu_ids]
    table = {name: [str(g) for g in ids] for name, ids in (table or {}).items()}
    if len(set(learners)) != len(learners):
        raise ValueError(f"a learner is named twice in {list(learners)}")
    if len(set(gpu_ids)) != len(gpu_ids):
        raise ValueError(f"a GPU is listed twice in {gpu_ids}")
    if gpu_ids and per_learner < 1:
        raise ValueError(f"per_learner={per_learner}: give each learner at least one GPU")
    _check_table(table, gpu_ids)
    held = {g for ids in table.values() for g in ids}
    free = [g for g in gpu_ids if g not in held]
    seats: dict[str, Seat] = {}
    dealt = 0
    for learner in learners:
        if learner in table and table[learner]:
            ids = tuple(table[learner])
            note = f"GPUs {', '.join(ids)} of the box are yours (the room's table)"
            seats[learner] = Seat(learner, ids, "table", note)
        elif not gpu_ids:
            note = "this room has no GPU: your ranks run on the CPU (gloo)"
            seats[learner] = Seat(learner, (), "no gpus", note)
        elif dealt + per_learner <= len(free):
            ids = tuple(free[dealt : dealt + per_learner])
            dealt += per_learner
            word = "GPU" if len(ids) == 1 else "GPUs"
            note = f"{word} {', '.join(ids)} of the box {'is' if len(ids) == 1 else 'are'} yours"
            seats[learner] = Seat(learner, ids, "dealt", note)
        else:
            note = (
                f"no GPU left for you: the room's {_plural(len(gpu_ids), 'GPU')} went to the "
                f"learners before you ({per_learner} each); your ranks run on the CPU (gloo) "
                "and the GPU sections skip themselves"
            )
            seats[learner] = Seat(learner, (), "gpus ran out", note)
    return seats


def seat_env(seat: Seat, visible_devices: bool = False) -> dict[str, str]:
    """The environment the hub gives a learner's server (``lk.doctor()`` reads it).

    Args:
        seat: from :func:`assign_gpus`.
        visible_devices: also set ``CUDA_VISIBLE_DEVICES`` to the seat's host ids (a local
            spawner, where every server sees every GPU). Not in a container started with
            :func:`device_requests`: there the seat's GPUs are the only ones, renumbered from 0.

    Returns:
        ``LABKIT_ROOM_LEARNER``, ``LABKIT_ROOM_GPUS`` (host ids, comma-separated, empty for
        none), ``LABKIT_ROOM_NOTE`` and, if asked, ``CUDA_VISIBLE_DEVICES``.
    """
    env = {ENV_LEARNER: seat.learner, ENV_GPUS: ",".join(seat.gpu_ids), ENV_NOTE: seat.note}
    if visible_devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(seat.gpu_ids)  # empty: no GPU at all
    return env


def device_requests(seat: Seat) -> list[dict]:
    """Docker's ``device_requests`` for a seat: its GPUs by id, none for a CPU-only seat.

    The form the Docker SDK turns into ``DeviceRequest`` objects (``docker run --gpus
    '"device=2,3"'`` on the command line); DockerSpawner passes it in ``extra_host_config``.

    Args:
        seat: from :func:`assign_gpus`.

    Returns:
        ``[{"driver": "nvidia", "device_ids": [...], "capabilities": [["gpu"]]}]`` or ``[]``.
    """
    if seat.cpu_only:
        return []
    return [{"driver": "nvidia", "device_ids": list(seat.gpu_ids), "capabilities": [["gpu"]]}]


def parse_table(text: str) -> dict[str, list[str]]:
    """A GPU table from one line of text, as an instructor writes it in an environment variable.

    Args:
        text: ``"alice=0,1; bob=2"`` (spaces ignored; empty for no table).

    Returns:
        ``{"alice": ["0", "1"], "bob": ["2"]}``.

    Raises:
        ValueError: an entry without ``=`` or without GPUs.
    """
    table: dict[str, list[str]] = {}
    for entry in filter(None, (e.strip() for e in text.split(";"))):
        name, sep, ids = entry.partition("=")
        gpus = [g.strip() for g in ids.split(",") if g.strip()]
        if not sep or not name.strip() or not gpus:
            raise ValueError(f"GPU table entry {entry!r}: write learner=id,id (e.g. alice=0,1)")
        table[name.strip()] = gpus
    return table
