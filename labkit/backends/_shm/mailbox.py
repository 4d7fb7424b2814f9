"""Point-to-point mailboxes: one single-producer, single-consumer ring of bytes per rank pair.

Introduced in notebooks/04_custom_backend.ipynb.

The ring from rank s to rank d has two counters that only grow: ``written`` (stored only by s)
and ``read`` (stored only by d). s may write while ``written - read < capacity``; d may read
while ``read < written``; position = counter mod capacity. A message is a 64-byte header (tag,
byte count, dtype, element count, message number) followed by its bytes, padded to 64 bytes,
so a header never wraps. Large messages stream through: the sender writes what fits and
publishes ``written`` piece by piece while the receiver is already copying the first pieces
out. Same memory-ordering argument as the collective counters (see ``sync.py``): data first,
then the counter; the counter first, then the data.
Reference: Lamport, "Specifying Concurrent Program Modules" (TOPLAS 1983): the lock-free
single-producer single-consumer queue.
"""

from __future__ import annotations

import struct

import torch

HEADER = 64
_HEAD = struct.Struct("<6q")
MSG_MAGIC = 0x4D534731  # "MSG1"
PIECE_BYTES = 256 << 10  # publish progress at least this often, so the peer can overlap

# Codes for dtypes in message headers (index in this tuple).
DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.complex128,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)


def _pad(x: int) -> int:
    return (x + HEADER - 1) // HEADER * HEADER


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPES.index(dtype) if dtype in DTYPES else -1


def dtype_of(code: int) -> str:
    return str(DTYPES[code]).removeprefix("torch.") if 0 <= code < len(DTYPES) else "?"


class MailboxEnd:
    """One end of the ring ``src`` → ``dst`` in a segment: its bytes and its two counters."""

    def __init__(self, seg, src: int, dst: int) -> None:
        lay = seg.layout
        self.mm, self.ctl = seg.mm, seg.ctl
        self.ring = seg.mailbox(src, dst)
        self.base = lay.mailbox_at(src, dst)
        self.cap = lay.mail_bytes
        self.w_written, self.w_read = lay.wr_word(src, dst), lay.rd_word(src, dst)


class OutBox(MailboxEnd):
    """This rank's end of the ring to ``dst``: writes messages."""

    def __init__(self, seg, src: int, dst: int) -> None:
        super().__init__(seg, src, dst)
        self.written = self.ctl[self.w_written]
        self.count = 0  # messages started

    def step(self, op) -> bool:
        """Write as much of ``op`` (a pending send) as fits; True if anything moved."""
        free = self.cap - (self.written - self.ctl[self.w_read])
        moved = False
        if not op.started:
            if free < HEADER:
                return False
            self.count += 1
            pos = self.base + self.written % self.cap
            head = (MSG_MAGIC, op.tag, op.data.numel(), op.dtype_code, op.numel, self.count)
            self.mm[pos : pos + _HEAD.size] = _HEAD.pack(*head)
            self.written += HEADER
            free -= HEADER
            op.started = moved = True
        total = op.data.numel()
        while op.done_bytes < total and free > 0:
            pos = self.written % self.cap
            k = min(total - op.done_bytes, free, self.cap - pos, PIECE_BYTES)
            self.ring[pos : pos + k].copy_(op.data[op.done_bytes : op.done_bytes + k])
            op.done_bytes += k
            self.written += k
            free -= k
            self.ctl[self.w_written] = self.written  # publish each piece
            moved = True
        if op.done_bytes == total and not op.finished:
            pad = _pad(self.written) - self.written
            if free >= pad:
                self.written += pad
                op.finished = moved = True
        self.ctl[self.w_written] = self.written
        return moved


class InBox(MailboxEnd):
    """This rank's end of the ring from ``src``: reads headers and bytes."""

    def __init__(self, seg, src: int, dst: int) -> None:
        super().__init__(seg, src, dst)
        self.read = self.ctl[self.w_read]
        self.current = None  # the message being received: an Incoming

    def available(self) -> int:
        return self.ctl[self.w_written] - self.read

    def peek_header(self) -> tuple[int, int, int, int, int] | None:
        """(tag, nbytes, dtype code, numel, message number) of the next message, if it is here."""
        if self.available() < HEADER:
            return None
        pos = self.base + self.read % self.cap
        magic, tag, nbytes, code, numel, count = _HEAD.unpack(self.mm[pos : pos + _HEAD.size])
        if magic != MSG_MAGIC:
            raise RuntimeError(f"labkit_shm: corrupt mailbox (magic {magic:#x})")
        return tag, nbytes, code, numel, count

    def consume_header(self) -> None:
        self.read += HEADER
        self.ctl[self.w_read] = self.read

    def step(self, target: torch.Tensor | None, done: int, total: int) -> int:
        """Copy available bytes of the current message into ``target[done:]`` (None: drop).

        Returns the new count of bytes received; past the last byte the padding is skipped.
        """
        avail = self.available()
        while done < total and avail > 0:
            pos = self.read % self.cap
            k = min(total - done, avail, self.cap - pos, PIECE_BYTES)
            if target is not None:
                target[done : done + k].copy_(self.ring[pos : pos + k])
            done += k
            avail -= k
            self.read += k
            self.ctl[self.w_read] = self.read  # the sender may reuse this space now
        if done == total:
            self.read = _pad(self.read)
            self.ctl[self.w_read] = self.read
        return done
