"""The ``labkit_simnet`` backend: a real backend that takes as long as a described network would.

Introduced in notebooks/05_communication_cost.ipynb.

Every operation goes to an inner backend (gloo by default), unchanged, so results are
bit-for-bit the inner backend's. Its Work then completes no earlier than the α-β-γ model
says the operation would take on the network: after the inner operation finishes, the rank
waits for ``max(0, predicted − actual)``, where ``predicted`` is
``lk.costmodel.predict(collective, n_bytes, p, network, algorithm)`` measured from the moment
the operation was called, and a send or receive costs α + n·β. The delay model *is* the cost
model, so "measurements" on this backend agree with the model by construction — which lets a
laptop feel a 10 GbE cluster, while notebook 05 shows where the real backends deviate from the
model. Barriers pass through without delay (benchmarks line ranks up with them).

Importing this module registers ``"labkit_simnet"``; its network is the environment variable
``LABKIT_SIMNET_NETWORK`` (a preset of ``lk.Network.PRESETS``, default ``10GbE``, or
``"<latency_us>,<bandwidth_gbps>"``) and its inner backend ``LABKIT_SIMNET_INNER`` (default
``gloo``)::

    lk.launch(fn, backend="labkit_simnet")                                   # 10 GbE over gloo
    lk.launch(fn, backend=lk.backends.simnet.spec(lk.Network.preset("NVLink")))
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta

import torch
import torch.distributed as dist

from labkit.backends._inner import check_inner, inner_group, register_wrapper, wrapper_spec
from labkit.backends._opcall import OpCall, WrappedWork
from labkit.backends._wrapper import WrapperProcessGroup
from labkit.costmodel import ALGORITHMS, Network, predict
from labkit.launcher import BackendSpec

__all__ = [
    "BACKEND_NAME",
    "COLLECTIVE_OF",
    "DelayedWork",
    "SimulatedNetworkProcessGroup",
    "check_algorithms",
    "create_group",
    "network_from_env",
    "simulated_spec",
    "spec",
]

BACKEND_NAME = "labkit_simnet"
NETWORK_ENV = "LABKIT_SIMNET_NETWORK"
INNER_ENV = "LABKIT_SIMNET_INNER"
DEFAULT_NETWORK = "10GbE"

# torch.distributed's op name (``OpCall.op``) → the cost model's collective. Ops not listed
# (barrier) are not delayed.
COLLECTIVE_OF: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "all_gather_coalesced": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "gather": "gather",
    "scatter": "scatter",
    "send": "p2p",
    "recv": "p2p",
}


class DelayedWork(WrappedWork):
    """The inner Work, completing no earlier than ``deadline`` (``time.perf_counter()``)."""

    def __init__(self, inner: dist.Work, deadline: float) -> None:
        super().__init__(inner)
        self._deadline = deadline
        self._future: torch.futures.Future | None = None
        self._lock = threading.Lock()

    def _rest(self) -> float:
        return self._deadline - time.perf_counter()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        ok = self._inner.wait(timeout)
        if (rest := self._rest()) > 0:
            time.sleep(rest)
        return ok

    def is_completed(self) -> bool:
        return self._inner.is_completed() and self._rest() <= 0

    def get_future(self) -> torch.futures.Future:
        """A future completed with the inner one's value once the deadline has passed too."""
        with self._lock:
            if self._future is None:
                inner = self._inner.get_future()  # raises for works without one (gloo p2p)
                delayed: torch.futures.Future = torch.futures.Future()

                def settle(fut: torch.futures.Future) -> None:
                    try:
                        delayed.set_result(fut.value())
                    except Exception as exc:  # noqa: BLE001 - handed to the waiter
                        delayed.set_exception(exc)

                def on_done(fut: torch.futures.Future) -> None:
                    rest = self._rest()
                    if rest > 0:  # a timer, not a sleep: never block the backend's thread
                        threading.Timer(rest, settle, args=(fut,)).start()
                    else:
                        settle(fut)

                inner.add_done_callback(on_done)
                self._future = delayed
            return self._future


def check_algorithms(algorithms: Mapping[str, str] | None) -> dict[str, str]:
    """``algorithms`` as a dict, once every algorithm is one the cost model has.

    Args:
        algorithms: collective → algorithm (e.g. ``{"all_reduce": "recursive_doubling"}``),
            or None for none.

    Returns:
        A new dict of them.

    Raises:
        ValueError: an unknown collective or algorithm.
    """
    algorithms = dict(algorithms or {})
    for collective, algorithm in algorithms.items():
        if algorithm not in ALGORITHMS.get(collective, {}):
            raise ValueError(f"no algorithm {algorithm!r} for collective {collective!r}")
    return algorithms


class SimulatedNetworkProcessGroup(WrapperProcessGroup):
    """Run each operation on ``inner``, then hold its completion until the model's time.

    Args:
        inner: the process group that does the work.
        network: the simulated ``lk.Network`` (α, β, γ).
        algorithms: collective → algorithm the model assumes (e.g. ``{"all_reduce":
            "recursive_doubling"}``); the rest use ``lk.costmodel.DEFAULT_ALGORITHM``.
        global_ranks: global rank of each rank of the group.

    Raises:
        ValueError: an unknown collective or algorithm in ``algorithms``.
    """

    backend_name = BACKEND_NAME

    def __init__(
        self,
        inner: dist.ProcessGroup,
        network: Network,
        algorithms: Mapping[str, str] | None = None,
        global_ranks: Sequence[int] | None = None,
    ) -> None:
        super().__init__(inner, global_ranks)
        self.network = network
        self.algorithms = check_algorithms(algorithms)

    def predicted_s(self, call: OpCall) -> float:
        """The model's time for ``call`` on this group's network (0 for ops not modelled)."""
        collective = COLLECTIVE_OF.get(call.op)
        if collective is None:
            return 0.0
        algorithm = self.algorithms.get(collective)
        return predict(collective, call.n_bytes, self.size(), self.network, algorithm)

    def after_op(self, call: OpCall, work: dist.Work) -> dist.Work:
        predicted = self.predicted_s(call)
        if predicted <= 0:
            return work
        # OpCall.start_ns is lk.trace.clock_ns(): time.perf_counter_ns(), the same clock.
        return DelayedWork(work, call.start_ns / 1e9 + predicted)


def network_from_env(value: str | None = None) -> Network:
    """The simulated network named by ``LABKIT_SIMNET_NETWORK`` (or ``value``).

    Args:
        value: a preset name (``"loopback"``, ``"10GbE"``, ``"100Gb-IB"``, ``"NVLink"``) or
            ``"<latency_us>,<bandwidth_gbps>"``, e.g. ``"20,1.25"``; None: the environment
            variable, default ``"10GbE"``.

    Returns:
        The ``Network``.

    Raises:
        ValueError: neither a preset nor two numbers.
    """
    text = (value if value is not None else os.environ.get(NETWORK_ENV, "")).strip()
    text = text or DEFAULT_NETWORK
    if "," in text:
        try:
            latency_us, bandwidth_gbps = (float(x) for x in text.split(","))
        except ValueError:
            raise ValueError(
                f"{NETWORK_ENV}={text!r}: expected a preset or '<latency_us>,<bandwidth_gbps>'"
            ) from None
        return Network(
            latency_us, bandwidth_gbps, name=f"{latency_us:g} µs, {bandwidth_gbps:g} GB/s"
        )
    return Network.preset(text)


def create_group(
    opts,
    backend_options=None,
    network: Network | None = None,
    inner: str | BackendSpec | None = None,
    algorithms: Mapping[str, str] | None = None,
    group_class: type[SimulatedNetworkProcessGroup] = SimulatedNetworkProcessGroup,
) -> SimulatedNetworkProcessGroup:
    """Creator for ``register_backend(..., extended_api=True)``: wrap a new inner group.

    Args:
        opts: the options torch passes an extended-API creator.
        backend_options: unused (torch passes its backend options).
        network: the simulated network; None: ``network_from_env()``.
        inner: the backend to wrap; None: ``$LABKIT_SIMNET_INNER`` (default gloo).
        algorithms: collective → algorithm the delays assume.
        group_class: the wrapper to build (``simlink`` passes its serial-link group).

    Returns:
        The ``group_class`` over a new inner group.
    """
    network = network if network is not None else network_from_env()
    inner = inner if inner is not None else os.environ.get(INNER_ENV, "gloo")
    pg, ranks = inner_group(inner, opts)
    return group_class(pg, network, algorithms, ranks)


def simulated_spec(
    backend_name: str,
    group_class: type[SimulatedNetworkProcessGroup],
    network: Network | str,
    inner: str | BackendSpec,
    algorithms: Mapping[str, str] | None,
) -> BackendSpec:
    """The spec of a simulated-network backend: ``group_class`` over ``inner``.

    Args:
        backend_name: the backend's name; the spec is named ``<backend_name>_<inner>``.
        group_class: ``SimulatedNetworkProcessGroup`` or a subclass.
        network: an ``lk.Network`` or a preset name.
        inner: a backend name or an ``lk.BackendSpec``.
        algorithms: collective → algorithm the delays assume (None: the model's defaults).

    Returns:
        lk.BackendSpec: for ``lk.launch(fn, backend=...)``.

    Raises:
        ValueError: an unknown preset, collective or algorithm, or a bad ``inner``.
    """
    if isinstance(network, str):
        network = network_from_env(network)
    if not isinstance(network, Network):
        raise ValueError(f"network must be an lk.Network or a preset name, got {network!r}")
    check_inner(inner)
    return wrapper_spec(
        backend_name,
        inner,
        create_group,
        network=network,
        algorithms=check_algorithms(algorithms),
        group_class=group_class,
    )


def spec(
    network: Network | str = DEFAULT_NETWORK,
    inner: str | BackendSpec = "gloo",
    algorithms: Mapping[str, str] | None = None,
) -> BackendSpec:
    """A backend that runs on ``inner`` and takes as long as ``network`` would.

    Args:
        network: an ``lk.Network`` (e.g. ``lk.costmodel.fit(...)``) or a preset name.
        inner: ``"gloo"`` (default), ``"labkit_shm"`` or another backend name, or a spec.
        algorithms: collective → algorithm the delays assume (default: the model's defaults).

    Returns:
        lk.BackendSpec: named ``labkit_simnet_<inner>``, for ``lk.launch(fn, backend=...)``.

    Raises:
        ValueError: an unknown preset, collective or algorithm, or a bad ``inner``.
    """
    return simulated_spec(BACKEND_NAME, SimulatedNetworkProcessGroup, network, inner, algorithms)


register_wrapper(BACKEND_NAME, create_group, INNER_ENV)
