"""Exercises of notebooks/19_fault_tolerance.ipynb.

Introduced in notebooks/19_fault_tolerance.ipynb.

``19_atomic_write``: write a file so that a crash at any moment leaves either the old file or
the complete new one — write a temporary name, ``fsync`` it, ``os.replace`` it over the
target, ``fsync`` the directory (rename(2) and fsync(2) manual pages; torchtitan and Orbax
commit checkpoints the same way). The checker runs the learner's function in this process
three times: a normal write (content, no leftover files); a write that "crashes" when it
tries to rename (the old file must be intact); and one with ``os.fsync``/``os.replace``
recorded (the new file's bytes synced before the rename, the directory synced after).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path

from labkit.checkpoint._atomic import atomic_write_bytes
from labkit.exercises import ExerciseFailed, exercise

OLD, NEW = b"old checkpoint " * 64, b"new checkpoint " * 128

PROMPT = """Write `atomic_write(path, data)`: replace the file `path` by `data` (bytes) so that a
crash at any moment leaves the old file or the whole new one: write `path + ".tmp"`, flush and
`os.fsync` it, `os.replace` it onto `path`, then `os.fsync` the directory."""


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: tmp, fsync, replace, fsync the directory.

    Reference solution of exercise ``19_atomic_write`` (``lk.checkpoint.atomic_write_bytes``).

    Args:
        path: the file to replace.
        data: its new bytes.

    Returns:
        None.
    """
    atomic_write_bytes(path, data)


class _Crash(BaseException):
    """Stands for the process dying at the rename."""


def _fresh(tmp: str, name: str) -> Path:
    folder = Path(tmp) / name
    folder.mkdir()
    (folder / "model.pt").write_bytes(OLD)
    return folder / "model.pt"


@exercise("19_atomic_write", reference=atomic_write, prompt=PROMPT)
def check_atomic_write(fn: Callable[[str, bytes], None]) -> dict[str, int]:
    """Check ``fn(path, data)`` writes completely, survives a crash at the rename, syncs.

    Args:
        fn: the learner's ``atomic_write``.

    Returns:
        ``{"fsyncs_before_rename": n, "dir_fsyncs_after_rename": m}`` of the recorded run.

    Raises:
        ExerciseFailed: what went wrong, in words.
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = _fresh(tmp, "plain")
        fn(str(path), NEW)
        if path.read_bytes() != NEW:
            raise ExerciseFailed("after atomic_write(path, data), the file must hold data")
        extra = sorted(p.name for p in path.parent.iterdir() if p != path)
        if extra:
            raise ExerciseFailed(
                f"leftover files next to the target: {extra}; rename the "
                "temporary file onto the target instead of copying it"
            )
        path = _fresh(tmp, "crash")
        _crash_at_rename(fn, path)
        if path.read_bytes() != OLD:
            raise ExerciseFailed(
                "the process died just before the rename and the old file is gone or "
                "half-written: never open the target itself for writing; write a temporary "
                "file and os.replace it onto the target"
            )
        return _check_syncs(fn, _fresh(tmp, "synced"))


def _crash_at_rename(fn: Callable, path: Path) -> None:
    def crash(*args: object, **kwargs: object) -> None:
        raise _Crash

    saved = os.replace, os.rename
    os.replace = os.rename = crash
    try:
        fn(str(path), NEW)
    except _Crash:
        return
    finally:
        os.replace, os.rename = saved
    raise ExerciseFailed(
        "atomic_write never renamed a file: write a temporary file and "
        "os.replace it onto the target"
    )


def _check_syncs(fn: Callable, path: Path) -> dict[str, int]:
    events: list[tuple[str, int | None]] = []  # ("file", inode) / ("dir", None) / ("rename", _)
    real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        events.append(("dir", None) if stat.S_ISDIR(st.st_mode) else ("file", st.st_ino))
        real_fsync(fd)

    def rename_with(real: Callable) -> Callable:
        def renamed(src: object, dst: object, *args: object, **kwargs: object) -> None:
            if Path(os.fsdecode(dst)).resolve() == path.resolve():
                events.append(("rename", None))
            real(src, dst, *args, **kwargs)

        return renamed

    os.fsync, os.replace, os.rename = fsync, rename_with(real_replace), rename_with(real_rename)
    try:
        fn(str(path), NEW)
    finally:
        os.fsync, os.replace, os.rename = real_fsync, real_replace, real_rename
    kinds = [kind for kind, _ in events]
    if "rename" not in kinds:
        raise ExerciseFailed("nothing was renamed onto the target; use os.replace(tmp, path)")
    at = kinds.index("rename")
    inode = path.stat().st_ino
    before = sum(1 for kind, ino in events[:at] if kind == "file" and ino == inode)
    after = sum(1 for kind, _ in events[at:] if kind == "dir")
    if before == 0:
        raise ExerciseFailed(
            "the new file's bytes were not fsynced before the rename: after a power cut the "
            "rename can survive while the data does not (f.flush(); os.fsync(f.fileno()))"
        )
    if after == 0:
        raise ExerciseFailed(
            "the directory was not fsynced after the rename: the new name itself may be lost "
            "(fd = os.open(folder, os.O_RDONLY); os.fsync(fd); os.close(fd))"
        )
    return {"fsyncs_before_rename": before, "dir_fsyncs_after_rename": after}
