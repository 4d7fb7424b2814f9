"""What runs inside each rank: receive the call, join the process group, run it, report back.

A rank is forked by the zygote with four descriptors from the launcher: a control socket
(the call comes in, the result or the error goes out), its stdout and stderr pipes (streamed
live into the cell), and a pipe that ``faulthandler`` writes this rank's Python stack to when
the launcher asks (SIGUSR1) — which is how a timeout shows where every rank was stuck.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import socket
import sys
import traceback
import warnings
from datetime import timedelta

from labkit.launcher import _context
from labkit.launcher._wire import recv_msg, send_msg
from labkit.launcher.failure_policy import EXIT_OK, EXIT_RAISED


def _redirect_output(out_fd: int, err_fd: int) -> None:
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=True)
        except (AttributeError, ValueError):
            pass


def _error_message(rank: int, exc: BaseException, where: str) -> dict:
    te = traceback.TracebackException.from_exception(exc)
    return {
        "op": "error",
        "rank": rank,
        "where": where,
        "type": type(exc).__name__,
        "message": str(exc),
        # Frames as data so the launcher can fill in source lines of notebook cells,
        # which only the kernel's linecache knows.
        "frames": [(f.filename, f.lineno, f.name, f.line) for f in te.stack],
        "exception": "".join(te.format_exception_only()),
        "text": "".join(te.format()),
    }


def _quiet_warnings(verbose: bool) -> None:
    if verbose:
        return
    # torch's deprecation notices repeat once per rank and per launch; learners see their own.
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module=r"torch(\.|$)")


def _run(call: dict, rank: int, world_size: int):
    import cloudpickle
    import torch
    import torch.distributed as dist

    from labkit.launcher._backend_spec import BackendSpec

    fn, args, kwargs, carrier = cloudpickle.loads(call["payload"])
    backend = (carrier.name if isinstance(carrier, BackendSpec) else carrier).lower()
    local = call["local"]
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(local["port"]),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        LABKIT_RANK=str(rank),
    )
    if local["loopback_if"]:
        # Keep gloo's and NCCL's own sockets on the loopback interface (never the room's LAN).
        os.environ.setdefault("GLOO_SOCKET_IFNAME", local["loopback_if"])
        os.environ.setdefault("NCCL_SOCKET_IFNAME", local["loopback_if"])
    torch.set_num_threads(local["threads"])
    device = torch.device(local["device"].replace("{rank}", str(rank)))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _context.set_rank_context(rank, world_size, device, backend)
    # torch reads TORCH_DISTRIBUTED_DEBUG when torch.distributed is imported: in the zygote,
    # long before this call's environment existed. Read it again, before any group exists, so
    # a rank sees the level a process started with this environment would (DETAIL wraps
    # every group in a collective-checking wrapper).
    dist.set_debug_level_from_env()
    if isinstance(carrier, BackendSpec):
        carrier.prepare()
    timeout = timedelta(seconds=local["pg_timeout"])
    store = dist.TCPStore("127.0.0.1", local["port"], world_size, False, timeout=timeout)
    dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
    )
    _state["store"] = store
    # No rank's code starts before every rank has finished init_process_group: code that
    # begins by leaving the group (notebook 00's init-method lab destroys it at once) would
    # otherwise close its sockets while a slower peer is still inside gloo's connectFullMesh
    # handshake, which then fails with "Connection closed by peer".
    _store_barrier(store, "labkit/initialised", world_size, local["pg_timeout"])
    return fn(rank, world_size, *args, **kwargs)


def _store_barrier(store, key: str, world_size: int, timeout_s: float) -> None:
    """Wait until ``world_size`` ranks have reached ``key`` on ``store`` (not on the group,
    so it works for every backend and even after the group is gone)."""
    from datetime import timedelta

    if store.add(key, 1) == world_size:
        store.set(f"{key}/all", "1")
    store.wait([f"{key}/all"], timedelta(seconds=timeout_s))


_state: dict = {}


def _exit_barrier(world_size: int, timeout_s: float) -> None:
    """Wait until every rank has finished ``fn`` before any rank tears its group down.

    Without it, a rank whose function needs no communication can destroy its group (closing
    its sockets) while a slower peer is still inside init_process_group's connection
    handshake — which then fails with gloo's "Connection closed by peer". The store is used,
    not the group, so this works for every backend.
    """
    store = _state.get("store")
    if store is not None:
        _store_barrier(store, "labkit/finished", world_size, timeout_s)


def _teardown() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        # Objects holding the group (DDP reducers, pending Work) go first; destroying under
        # them is where gloo's "terminate called without an active exception" comes from.
        gc.collect()
        dist.destroy_process_group()


def main(
    rank: int,
    world_size: int,
    launch_id: int,
    ctrl_fd: int,
    out_fd: int,
    err_fd: int,
    stack_fd: int,
) -> int:
    """Run one rank to completion and return its exit code (the zygote ``_exit``s with it)."""
    _redirect_output(out_fd, err_fd)
    faulthandler.enable(file=sys.stderr, all_threads=True)  # segfaults print a Python stack
    stack_file = os.fdopen(stack_fd, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    ctrl = socket.socket(fileno=ctrl_fd)
    call, _ = recv_msg(ctrl)
    os.environ.clear()
    os.environ.update(call["env"])
    sys.path[:] = call["sys_path"]
    try:
        os.chdir(call["cwd"])
    except OSError:
        pass
    _quiet_warnings(call["local"]["verbose"])
    try:
        import setproctitle

        setproctitle.setproctitle(
            f"labkit rank {rank}/{world_size} (launch {launch_id}, "
            f"launcher pid {call['launcher_pid']})"
        )
    except ImportError:
        pass

    try:
        result = _run(call, rank, world_size)
    except BaseException as exc:  # noqa: BLE001 - everything is reported, then the rank ends
        send_msg(ctrl, _error_message(rank, exc, "run"))
        return EXIT_RAISED
    try:
        import cloudpickle

        data = cloudpickle.dumps(result)
    except Exception as exc:  # noqa: BLE001
        err = RuntimeError(
            f"the return value of rank {rank} ({type(result).__name__}) cannot be sent back "
            f"to the launcher: {exc}. Return plain data (numbers, lists, CPU tensors)."
        )
        send_msg(ctrl, _error_message(rank, err, "result"))
        return EXIT_RAISED
    # The result is delivered before teardown: whatever teardown does cannot change it.
    send_msg(ctrl, {"op": "result", "rank": rank, "data": data})
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        _exit_barrier(world_size, call["local"]["pg_timeout"])
        _teardown()
    except Exception:  # noqa: BLE001 - teardown after a delivered result is not the user's failure
        pass
    send_msg(ctrl, {"op": "done", "rank": rank})
    return EXIT_OK
