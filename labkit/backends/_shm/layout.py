"""The layout of a labkit_shm segment: where every counter, descriptor, slot and mailbox is.

Introduced in notebooks/04_custom_backend.ipynb.

Regions, in order (each starts on a 64-byte cache line; ``n`` ranks)::

    header        64 B      magic, world size, sizes (checked by every rank that attaches)
    rank lines    n x 64 B  per rank: round counter, current collective, state, pid
    p2p counters  2 n^2 x 64 B  per ordered pair (s, d): bytes written by s, bytes read by d
    descriptors   n x 3 x D  per rank and buffer: the collective's description (JSON)
    slots         n x 3 x C  per rank: three data buffers, used by rounds in turn
    mailboxes     n^2 x M    per ordered pair (s, d): a ring of bytes from s to d

Each counter sits alone on its cache line and has one writer, so ranks never write the same
line (no false sharing between a writer and its readers).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

MAGIC = 0x4C4B53484D3031  # "LKSHM01"
LINE = 64  # bytes in a cache line; 8 int64 words

# Word offsets inside a rank's line.
W_ROUND, W_SEQ, W_KIND, W_STATE, W_PID = 0, 1, 2, 3, 4
STATE_ATTACHED, STATE_LEFT = 1, 2
NBUF = 3  # data buffers per rank (see sync.py and the pipelined all_reduce)
MIN_SLOT = 64 << 10  # rank 0 shrinks a segment that does not fit down to this


def _align(x: int, to: int = LINE) -> int:
    return (x + to - 1) // to * to


@dataclass(frozen=True)
class Layout:
    """Byte offsets of every region of a segment for ``world_size`` ranks."""

    world_size: int
    slot_bytes: int  # C: one data buffer of one rank
    mail_bytes: int  # M: one mailbox ring
    desc_bytes: int  # D: one descriptor

    @classmethod
    def for_world(cls, world_size: int, slot: int = 0, mail: int = 0) -> Layout:
        """The preferred sizes: slots of 1 MiB, or 4 MiB when ranks outnumber CPU cores (48
        MiB of slots at most); mailboxes of 1 MiB (4 MiB in all beyond 2 ranks, 64 KiB at
        least).

        Measured on a 2-core machine, 16 MB all_reduce: with 2 ranks 1 MiB slots beat 4 MiB
        ones by about 1.4x (a chunk stays in the 2 MiB L2 cache); with 4 ranks 4 MiB slots
        beat 1 MiB ones by about 1.3x (each round costs context switches, so fewer rounds).
        ``LABKIT_SHM_SLOT_BYTES`` and ``LABKIT_SHM_MAIL_BYTES`` override the sizes.
        """
        n = world_size
        slot = slot or int(os.environ.get("LABKIT_SHM_SLOT_BYTES", 0))
        preferred = (1 << 20) if n <= (os.cpu_count() or 1) else (4 << 20)
        slot = slot or min(preferred, (48 << 20) // (NBUF * n))
        mail = mail or int(os.environ.get("LABKIT_SHM_MAIL_BYTES", 0))
        mail = mail or max(64 << 10, min(1 << 20, (4 << 20) // max(1, n * (n - 1))))
        desc = _align(1024 + 48 * n)
        return cls(n, _align(max(slot, 4096), 4096), _align(max(mail, 4096), 4096), desc)

    def halved(self) -> Layout | None:
        """The same layout with half the slots and mailboxes (None below the minimum)."""
        if self.slot_bytes <= MIN_SLOT:
            return None
        return Layout.for_world(
            self.world_size, self.slot_bytes // 2, max(4096, self.mail_bytes // 2)
        )

    @property
    def lines_off(self) -> int:
        return LINE

    @property
    def wr_off(self) -> int:  # pair counters: written (by the sender)
        return self.lines_off + self.world_size * LINE

    @property
    def rd_off(self) -> int:  # pair counters: read (by the receiver)
        return self.wr_off + self.world_size**2 * LINE

    @property
    def control_bytes(self) -> int:
        return self.rd_off + self.world_size**2 * LINE

    @property
    def desc_off(self) -> int:
        return self.control_bytes

    @property
    def slots_off(self) -> int:
        return _align(self.desc_off + self.world_size * NBUF * self.desc_bytes, 4096)

    @property
    def mail_off(self) -> int:
        return self.slots_off + self.world_size * NBUF * self.slot_bytes

    @property
    def total_bytes(self) -> int:
        return self.mail_off + self.world_size**2 * self.mail_bytes

    # word indices into the control area viewed as int64
    def word(self, rank: int, field: int) -> int:
        return (self.lines_off + rank * LINE) // 8 + field

    def wr_word(self, src: int, dst: int) -> int:
        return (self.wr_off + (src * self.world_size + dst) * LINE) // 8

    def rd_word(self, src: int, dst: int) -> int:
        return (self.rd_off + (src * self.world_size + dst) * LINE) // 8

    def desc_at(self, rank: int, buf: int) -> int:
        return self.desc_off + (rank * NBUF + buf) * self.desc_bytes

    def mailbox_at(self, src: int, dst: int) -> int:
        return self.mail_off + (src * self.world_size + dst) * self.mail_bytes

    def header_words(self) -> list[int]:
        return [MAGIC, self.world_size, self.slot_bytes, self.mail_bytes, self.desc_bytes]
