"""Blocking waits on a word of shared memory: Linux futexes, called through ctypes.

Introduced in notebooks/04_custom_backend.ipynb.

A rank that waits for a peer's round counter can poll it (fast wake-up, but it burns the CPU
that the peer may need: with 4 ranks on 2 cores, two ranks share each core) or sleep and poll
again (frees the CPU, but wakes late: up to the sleep's length after the counter moved). A
futex gives both: ``wait(addr, seen)`` puts the caller to sleep in the kernel only if the
32-bit word at ``addr`` still holds ``seen`` (checked atomically, so a wake-up between the
caller's last look and its sleep is never lost), and ``wake(addr)`` wakes every sleeper on
that word right after the owner's store. The words live in a ``MAP_SHARED`` mapping, so the
futexes are the shared (not process-private) kind, keyed by the page, which works across
processes.

Measured on a 2-core machine that other jobs kept busy (load average 6-14), medians of
60-300 calls paired in one run, against the earlier wait (spin 20 us, yield for 2 ms, then
sleep 50-500 us): blocking at once made a 4-rank barrier take 0.7 ms instead of 3.0 ms and a
2-rank 8-byte all_reduce 0.67-0.75x the time, but 2-rank 16 MB all_reduces 1.1-1.2x slower
(a blocked rank's wake-up cost 0.2-1 ms there). So ``sync.py`` keeps the spinning and
yielding and blocks where the earlier wait slept: 8-byte all_reduces then took 0.9x (2
ranks) and 0.95x (4 ranks) the earlier time, 16 MB ones within 10% of it either way (they
are bound by the copies).

Reference: Drepper, "Futexes Are Tricky" (2011); futex(2).
Where futexes are missing (not Linux, or an unknown CPU), ``AVAILABLE`` is False and the
callers fall back to polling; ``LABKIT_SHM_FUTEX=0`` (read at import) does the same, to
compare the two.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import sys

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
FUTEX_WAIT, FUTEX_WAKE = 0, 1
WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load():
    nr = _SYS_FUTEX.get(platform.machine().lower())
    if not sys.platform.startswith("linux") or nr is None:
        return None, None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.syscall
    except (OSError, AttributeError):
        return None, None
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    fn.argtypes += [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return fn, nr


_syscall, _NR = _load()
AVAILABLE = _syscall is not None and os.environ.get("LABKIT_SHM_FUTEX", "1") != "0"


def timespec(seconds: float):
    """A relative timeout for ``wait`` (build it once and reuse it)."""
    return ctypes.byref(_Timespec(int(seconds), int(seconds % 1 * 1e9)))


def wait(addr: int, seen: int, timeout) -> None:
    """Sleep until the 32-bit word at ``addr`` is woken, if it still holds ``seen``.

    Returns after a ``wake``, after ``timeout``, at once if the word no longer holds ``seen``,
    or on a signal: the caller always looks at the word again.

    Args:
        addr: address of a 4-byte aligned word in a shared mapping.
        seen: the value the caller last read there (its low 32 bits count).
        timeout: the longest sleep (``timespec(seconds)``).

    Raises:
        OSError: the kernel rejected the call (anything but a timeout, a changed word or a
            signal).
    """
    low = seen & 0xFFFFFFFF
    res = _syscall(_NR, addr, FUTEX_WAIT, low - (1 << 32) if low >> 31 else low, timeout, None, 0)
    if res == -1:
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(err, f"futex wait: {os.strerror(err)}")


def wake(addr: int) -> None:
    """Wake every process sleeping in ``wait`` on the word at ``addr`` (cheap if none).

    Args:
        addr: address of the word the caller has just stored to.
    """
    _syscall(_NR, addr, FUTEX_WAKE, WAKE_ALL, None, None, 0)
