"""``NCCL_DEBUG=INFO`` output, read line by line.

Introduced in notebooks/19_fault_tolerance.ipynb (section 5, debugging a distributed job).

NCCL documents its log format in the NCCL User Guide ("Troubleshooting > Logging", and
"Environment Variables": ``NCCL_DEBUG``, ``NCCL_DEBUG_SUBSYS``, ``NCCL_DEBUG_FILE``,
``NCCL_DEBUG_TIMESTAMP_FORMAT``). ``NCCL_DEBUG=VERSION`` prints only ``NCCL version 2.x.y+cudaZ``;
at ``WARN``, ``INFO`` and ``TRACE`` each line is::

    [timestamp] host:pid:tid [cudaDev] [file.cc:line] NCCL LEVEL message

where the bracketed timestamp (levels chosen by ``NCCL_DEBUG_TIMESTAMP_LEVELS``) and the
source location appear on the documentation's WARN example and not on its INFO lines.
``NCCL_DEBUG_SUBSYS`` chooses which subsystems (INIT, NET, GRAPH, COLL, P2P, ENV, ...) print
at INFO. The messages themselves are not a stable interface (the documentation says values and
formatting vary by version): a summary field stays empty when its line is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_LINE = re.compile(
    r"^(?:\[(?P<time>[^\]]*)\]\s+)?"
    r"(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+)\s+\[(?P<device>\d+)\]\s+"
    r"(?:(?P<where>\S+:\d+)\s+)?NCCL\s+(?P<level>INFO|WARN|TRACE|ABORT)\s?(?P<message>.*)$"
)
_VERSION = re.compile(r"NCCL version (\S+)")
_NETWORK = re.compile(r"Using network (\S+)")
_CHANNEL = re.compile(r"Channel (\d+)/(\d+)\s*:")
_INIT = re.compile(r"rank (\d+) nranks (\d+) cudaDev (\d+).*Init COMPLETE")

# (what a line contains, what it tells you): the annotations printed next to a real log.
NCCL_LINE_NOTES: tuple[tuple[str, str], ...] = (
    ("NCCL version", "the NCCL library this process loaded (rank 0 prints it)"),
    ("Bootstrap", "the out-of-band socket the ranks use to exchange their addresses"),
    ("NET/Socket", "the interface NCCL's socket transport picked (NCCL_SOCKET_IFNAME)"),
    ("NET/IB", "InfiniBand devices found (none on a machine without IB)"),
    ("Using network", "the network transport between nodes: IB, or Socket (TCP)"),
    ("Channel ", "a channel: one ring/tree path of the collective; NN/MM = channel NN of MM"),
    ("Connected all rings", "every ring channel is connected: the communicator can run"),
    ("Connected all trees", "every tree channel is connected"),
    ("Init COMPLETE", "ncclCommInitRank finished for this rank: rank, nranks and its GPU"),
)


@dataclass(frozen=True)
class NcclLine:
    """One line of NCCL's log.

    Attributes:
        host: the hostname. pid, tid: process and thread. device: the CUDA device index.
        level: ``INFO``, ``WARN``, ``TRACE`` (or ``VERSION`` for the bare version line).
        message: the text after the level.
        where: ``file.cc:line`` (WARN lines), else "".
        time: the timestamp, when the line has one, else "".
    """

    host: str
    pid: int
    tid: int
    device: int
    level: str
    message: str
    where: str = ""
    time: str = ""


@dataclass
class NcclLog:
    """What a run's NCCL log says, summarised.

    Attributes:
        lines: every NCCL line, in order (other output is skipped).
        version: ``"2.27.7+cuda13.0"`` from the version line, or None.
        networks: the transports named by "Using network ..." lines.
        channels: the most channels any "Channel NN/MM" line announced, or 0.
        rings_connected: a "Connected all rings" line was seen.
        init_complete: ``(rank, nranks, cudaDev)`` of every "Init COMPLETE" line.
        warnings: the WARN lines.
    """

    lines: list[NcclLine] = field(default_factory=list)
    version: str | None = None
    networks: set[str] = field(default_factory=set)
    channels: int = 0
    rings_connected: bool = False
    init_complete: list[tuple[int, int, int]] = field(default_factory=list)
    warnings: list[NcclLine] = field(default_factory=list)


def parse_nccl_line(line: str) -> NcclLine | None:
    """Read one line of output; None when it is not an NCCL log line.

    Args:
        line: a line of a process's stderr/stdout (a ``[rank N]:`` or ``[default0]:`` prefix
            added by a launcher is skipped).

    Returns:
        The parsed line, or None.
    """
    text = re.sub(r"^\[(?:rank\s?\d+|default\d+)\]:?\s*", "", line.rstrip("\n"))
    m = _LINE.match(text)
    if m:
        return NcclLine(
            host=m["host"],
            pid=int(m["pid"]),
            tid=int(m["tid"]),
            device=int(m["device"]),
            level=m["level"],
            message=m["message"],
            where=m["where"] or "",
            time=m["time"] or "",
        )
    if text.startswith("NCCL version "):  # NCCL_DEBUG=VERSION prints the bare line
        return NcclLine(host="", pid=0, tid=0, device=-1, level="VERSION", message=text)
    return None


def read_nccl_log(text: str) -> NcclLog:
    """Summarise NCCL's lines in a run's output.

    Args:
        text: everything the processes printed (other lines are ignored).

    Returns:
        The ``NcclLog``.
    """
    log = NcclLog()
    for raw in text.splitlines():
        line = parse_nccl_line(raw)
        if line is None:
            continue
        log.lines.append(line)
        msg = line.message
        if (v := _VERSION.search(msg)) and log.version is None:
            log.version = v.group(1)
        if n := _NETWORK.search(msg):
            log.networks.add(n.group(1))
        if c := _CHANNEL.search(msg):
            log.channels = max(log.channels, int(c.group(2)))
        log.rings_connected |= "Connected all rings" in msg
        if i := _INIT.search(msg):
            log.init_complete.append((int(i.group(1)), int(i.group(2)), int(i.group(3))))
        if line.level == "WARN":
            log.warnings.append(line)
    return log


def annotate_nccl_log(log: NcclLog, per_note: int = 1) -> list[tuple[str, str]]:
    """The lines worth reading first, each with what it tells you.

    Args:
        log: a parsed log.
        per_note: how many lines to keep for each kind of line (the first ones).

    Returns:
        ``(message, note)`` pairs, in log order.
    """
    kept: dict[str, int] = {}
    out = []
    for line in log.lines:
        for needle, note in NCCL_LINE_NOTES:
            if needle in line.message and kept.get(needle, 0) < per_note:
                kept[needle] = kept.get(needle, 0) + 1
                out.append((line.message, note))
                break
    return out
