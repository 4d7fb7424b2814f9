"""A simulated network whose link carries one operation at a time (``labkit_simnet`` + a queue).

Introduced in notebooks/07_ddp_buckets_and_overlap.ipynb.

``labkit_simnet`` (``labkit.backends.simnet``) completes each operation no earlier than
``start + predicted``, measured from the moment *that* operation was called. Operations in
flight at the same time then share nothing: four 1 MB all-reduces issued together finish
as early as one would. A rank has one network link, so this backend queues them: an
operation starts on the link when it is called or when the previous operation of the
group has left the link, whichever is later, and holds the link for the model's time
(``lk.costmodel.predict``)::

    link_free = max(called, link_free) + predicted      # the op's completion time

This is what makes bucket sizes and overlap measurable on a laptop: a DDP step's
all-reduces cost the sum of their times, and the only way to hide them is to start them
while backward still computes. Results are the inner backend's, bit for bit; each rank's
Work completes no earlier than the model says (the inner operation may take longer on a
slow machine: then it sets the pace). Use it through ``spec``, alone or under the recording
backend::

    lk.launch(fn, backend=lk.backends.simlink.spec("10GbE"))
    lk.launch(fn, backend=lk.backends.recording.spec(lk.backends.simlink.spec(net)))
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch.distributed as dist

from labkit.backends._opcall import OpCall
from labkit.backends.simnet import (
    DEFAULT_NETWORK,
    DelayedWork,
    SimulatedNetworkProcessGroup,
    simulated_spec,
)
from labkit.costmodel import Network
from labkit.launcher import BackendSpec

__all__ = ["BACKEND_NAME", "SerialLinkProcessGroup", "spec"]

BACKEND_NAME = "labkit_simlink"


class SerialLinkProcessGroup(SimulatedNetworkProcessGroup):
    """A simulated network where each operation waits for the previous one to leave the link.

    Args:
        inner: the process group that does the work.
        network: the simulated ``lk.Network``.
        algorithms: collective → algorithm the model assumes (see ``SimulatedNetworkProcessGroup``).
        global_ranks: global rank of each rank of the group.

    Raises:
        ValueError: an unknown collective or algorithm in ``algorithms``.
    """

    backend_name = BACKEND_NAME

    def __init__(self, inner, network, algorithms=None, global_ranks=None) -> None:
        super().__init__(inner, network, algorithms, global_ranks)
        self._lock = threading.Lock()
        self.link_free_s = 0.0  # time.perf_counter() when the link is next free

    def after_op(self, call: OpCall, work: dist.Work) -> dist.Work:
        predicted = self.predicted_s(call)
        if predicted <= 0:
            return work
        with self._lock:  # DDP's hooks may issue from autograd threads
            start = max(call.start_ns / 1e9, self.link_free_s)
            self.link_free_s = deadline = start + predicted
        return DelayedWork(work, deadline)


def spec(
    network: Network | str = DEFAULT_NETWORK,
    inner: str | BackendSpec = "gloo",
    algorithms: Mapping[str, str] | None = None,
) -> BackendSpec:
    """A backend that runs on ``inner`` and queues every operation on one simulated link.

    Args:
        network: an ``lk.Network`` or a preset name (``"10GbE"``, ...).
        inner: ``"gloo"`` (default), ``"labkit_shm"`` or another backend name, or a spec.
        algorithms: collective → algorithm the delays assume (default: the model's defaults).

    Returns:
        lk.BackendSpec: named ``labkit_simlink_<inner>``, for ``lk.launch(fn, backend=...)``.

    Raises:
        ValueError: an unknown preset, collective or algorithm, or a bad ``inner``.
    """
    return simulated_spec(BACKEND_NAME, SerialLinkProcessGroup, network, inner, algorithms)
