"""The shared-memory segment of one labkit_shm group: creation, attachment, clean-up.

Introduced in notebooks/04_custom_backend.ipynb.

Life cycle, so that nothing is left in /dev/shm even if ranks are SIGKILLed: rank 0 creates
``/dev/shm/labkit-shm-...`` with ``O_CREAT | O_EXCL`` and mode 0o600, reserves its pages
(``posix_fallocate``: a full /dev/shm fails here, not with SIGBUS later; rank 0 then halves
the sizes until it fits), maps it and shares its name and sizes through the store; each rank
maps it (checking owner, mode and size) and writes its pid into its line; as soon as every
rank's pid is there, the name is unlinked (the mappings stay valid). Every rank waits for that
moment and unlinks too, so the name goes away if any rank survives, and a rank that dies
before attaching is seen (pids come through the store first) within milliseconds. The layout
of the segment is in ``layout.py``.
"""

from __future__ import annotations

import mmap
import os
import secrets
import stat
import tempfile
import time
from datetime import timedelta

import torch

from labkit.backends._shm.layout import NBUF, STATE_ATTACHED, W_PID, W_STATE, Layout

# /dev/shm is RAM (tmpfs) on Linux; elsewhere (macOS) a file in the temporary directory, mapped
# shared, works the same way through the page cache.
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
PREFIX = "labkit-shm-"


class Segment:
    """One mapped segment: the int64 control words and uint8 tensors over the data regions."""

    def __init__(self, mm: mmap.mmap, layout: Layout, name: str) -> None:
        self.mm = mm
        self.layout = layout
        self.name = name
        self.ctl = memoryview(mm)[: layout.control_bytes].cast("q")
        # Tensors that view the mapping: copies and reductions on them run at memory speed.
        self.bytes = torch.frombuffer(mm, dtype=torch.uint8)
        n, c = layout.world_size, layout.slot_bytes
        end = layout.slots_off + n * NBUF * c
        self.slots_u8 = self.bytes[layout.slots_off : end].view(n, NBUF, c)
        self._slot_views: dict[torch.dtype, torch.Tensor] = {}

    def slots(self, dtype: torch.dtype) -> torch.Tensor:
        """All slots as ``dtype``: shape [n, NBUF, C // itemsize] (rank, buffer, element)."""
        view = self._slot_views.get(dtype)
        if view is None:
            n, c = self.layout.world_size, self.layout.slot_bytes
            view = self.slots_u8.view(n * NBUF * c).view(dtype).view(n, NBUF, -1)
            self._slot_views[dtype] = view
        return view

    def mailbox(self, src: int, dst: int) -> torch.Tensor:
        start = self.layout.mailbox_at(src, dst)
        return self.bytes[start : start + self.layout.mail_bytes]

    def write_desc(self, rank: int, buf: int, text: bytes) -> None:
        off = self.layout.desc_at(rank, buf)
        if len(text) + 4 > self.layout.desc_bytes:
            raise ValueError(f"operation description too long ({len(text)} bytes)")
        self.mm[off : off + 4] = len(text).to_bytes(4, "little")
        self.mm[off + 4 : off + 4 + len(text)] = text

    def read_desc(self, rank: int, buf: int) -> bytes:
        off = self.layout.desc_at(rank, buf)
        size = int.from_bytes(self.mm[off : off + 4], "little")
        return self.mm[off + 4 : off + 4 + min(size, self.layout.desc_bytes - 4)]


def _shm_path(name: str) -> str:
    return os.path.join(SHM_DIR, name)


def unlink_quietly(name: str) -> None:
    try:
        os.unlink(_shm_path(name))
    except FileNotFoundError:
        pass


def _reserve(fd: int, layout: Layout) -> Layout:
    """Reserve the segment's pages, halving the sizes while /dev/shm is too small."""
    first = layout
    while True:
        try:
            if hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, layout.total_bytes)
            else:
                os.ftruncate(fd, layout.total_bytes)
            return layout
        except OSError as exc:
            os.ftruncate(fd, 0)  # give back what a failed attempt reserved
            smaller = layout.halved()
            if smaller is None:
                free = os.statvfs(SHM_DIR)
                raise RuntimeError(
                    f"labkit_shm: cannot reserve {first.total_bytes / 2**20:.1f} MiB (nor "
                    f"{layout.total_bytes / 2**20:.1f} MiB) in {SHM_DIR}, which has "
                    f"{free.f_bavail * free.f_frsize / 2**20:.1f} MiB free: {exc}. In Docker, "
                    "start the container with --shm-size=1g (or --ipc=host)."
                ) from None
            layout = smaller


def _create(layout: Layout) -> tuple[mmap.mmap, str, Layout]:
    name = f"{PREFIX}{os.getuid()}-{os.getpid()}-{secrets.token_hex(6)}"
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(_shm_path(name), flags, 0o600)
    try:
        layout = _reserve(fd, layout)
        mm = mmap.mmap(fd, layout.total_bytes)
    except BaseException:
        unlink_quietly(name)
        raise
    finally:
        os.close(fd)
    ctl = memoryview(mm).cast("q")
    for i, v in enumerate(layout.header_words()):
        ctl[i] = v
    ctl.release()
    return mm, name, layout


def _attach(name: str, layout: Layout) -> mmap.mmap:
    if not name.startswith(PREFIX) or "/" in name:
        raise RuntimeError(f"labkit_shm: refusing to open segment name {name!r}")
    fd = os.open(_shm_path(name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise RuntimeError(f"labkit_shm: {name} is not a private segment of this user")
        if st.st_size != layout.total_bytes:
            raise RuntimeError(
                f"labkit_shm: {name} has {st.st_size} bytes, expected {layout.total_bytes}"
            )
        mm = mmap.mmap(fd, layout.total_bytes)
    finally:
        os.close(fd)
    ctl = memoryview(mm).cast("q")
    header = list(ctl[: len(layout.header_words())])
    ctl.release()
    if header != layout.header_words():
        mm.close()
        raise RuntimeError(f"labkit_shm: {name} was made for another group layout")
    return mm


def open_segment(store, rank: int, world_size: int, timeout: timedelta, watch) -> Segment:
    """Create (rank 0) or attach (others) the group's segment, then unlink its name.

    Args:
        store: the group's store (a PrefixStore), used for the name and the pids.
        rank: this rank in the group.
        world_size: ranks in the group.
        timeout: how long to wait for the others.
        watch: a ``PeerWatch`` that already knows every rank's pid.

    Returns:
        The mapped segment; its name no longer exists in /dev/shm.

    Raises:
        RuntimeError: a rank died or did not attach in time, or /dev/shm is full.
    """
    deadline = time.monotonic() + timeout.total_seconds()
    if rank == 0:
        mm, name, layout = _create(Layout.for_world(world_size))
        try:
            store.set("labkit_shm/name", f"{name} {layout.slot_bytes} {layout.mail_bytes}")
        except BaseException:
            unlink_quietly(name)
            raise
    else:
        store.wait(["labkit_shm/name"], timeout)
        name, slot, mail = store.get("labkit_shm/name").decode().split()
        layout = Layout.for_world(world_size, int(slot), int(mail))
        mm = _attach(name, layout)
    seg = Segment(mm, layout, name)
    try:
        seg.ctl[layout.word(rank, W_PID)] = os.getpid()
        seg.ctl[layout.word(rank, W_STATE)] = STATE_ATTACHED
        _wait_attached(seg, rank, deadline, watch)
    finally:
        unlink_quietly(name)  # every rank tries: the name must not outlive any survivor
    return seg


def _wait_attached(seg: Segment, rank: int, deadline: float, watch) -> None:
    lay = seg.layout
    missing = [r for r in range(lay.world_size) if seg.ctl[lay.word(r, W_PID)] == 0]
    pause = 1e-4
    while missing:
        watch.check_alive(missing, "while creating the shared-memory segment")
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"labkit_shm: rank {rank} timed out creating the group: rank(s) "
                f"{', '.join(map(str, missing))} never attached to the shared-memory segment"
            )
        time.sleep(pause)
        pause = min(pause * 2, 5e-3)
        missing = [r for r in missing if seg.ctl[lay.word(r, W_PID)] == 0]
