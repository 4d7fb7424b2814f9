"""Reading what PyTorch and NCCL report about a distributed job that goes wrong.

Introduced in notebooks/19_fault_tolerance.ipynb (section 5, debugging a distributed job).

- ``mismatch``: the error ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` raises for mismatched collectives,
  read into one fingerprint (operation, shapes, dtypes, sequence number) per rank;
- ``nccl_log``: ``NCCL_DEBUG=INFO`` lines, read field by field and summarised;
- ``flight_recorder``: a rank's flight recorder buffer written where NCCL's watchdog writes it,
  read back, and compared across ranks (who stopped at which collective);
- ``torchrun``: run a module under ``torchrun`` on this machine, on loopback, with a deadline.

Nothing here imports torch at import time; ``import labkit`` stays light.
"""

from __future__ import annotations

from labkit.debug.flight_recorder import (
    FrEntry,
    RankPosition,
    behind,
    compare_ranks,
    describe_positions,
    dump_flight_recorder,
    fr_entries,
    load_flight_recorder,
    load_flight_recorders,
)
from labkit.debug.mismatch import CollectiveMismatch, Fingerprint, parse_collective_mismatch
from labkit.debug.nccl_log import (
    NcclLine,
    NcclLog,
    annotate_nccl_log,
    parse_nccl_line,
    read_nccl_log,
)
from labkit.debug.torchrun import TorchrunResult, run_torchrun

__all__ = [
    "CollectiveMismatch",
    "Fingerprint",
    "FrEntry",
    "NcclLine",
    "NcclLog",
    "RankPosition",
    "TorchrunResult",
    "annotate_nccl_log",
    "behind",
    "compare_ranks",
    "describe_positions",
    "dump_flight_recorder",
    "fr_entries",
    "load_flight_recorder",
    "load_flight_recorders",
    "parse_collective_mismatch",
    "parse_nccl_line",
    "read_nccl_log",
    "run_torchrun",
]
