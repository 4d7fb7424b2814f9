"""What every lab script shares: torchrun's environment, the process group, checksums, exit.

Introduced in notebooks/19_fault_tolerance.ipynb (the scripts run under ``torchrun``).

torchrun (``torch.distributed.run``) starts one process per local rank and sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT`` (from the rendezvous) and,
on restarts, ``TORCHELASTIC_RESTART_COUNT``; ``init_process_group``'s default ``env://``
reads them (https://pytorch.org/docs/stable/elastic/run.html).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from labkit.launcher._context import set_rank_context
from labkit.launcher.device_rule import MULTI_DEVICE, Choice, choose_for_job


@dataclass(frozen=True)
class Env:
    """This process's place in the job, as torchrun describes it."""

    rank: int
    world_size: int
    local_rank: int
    restart_count: int
    device: torch.device


def base_parser(description: str) -> argparse.ArgumentParser:
    """The options every lab script accepts.

    Args:
        description: the script's docstring (shown by ``--help``).

    Returns:
        A parser with ``--steps --batch-size --lr --seed --backend --timeout --out``.
    """
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=20, help="optimizer steps in total")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="model and shuffle seed")
    p.add_argument("--backend", default="auto", help='"auto" (nccl with GPUs, else gloo)')
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout, seconds")
    p.add_argument("--out", default=None, help="rank 0 saves the final state_dict here")
    return p


def init(backend: str = "auto", timeout_s: float = 120.0) -> Env:
    """Join the job torchrun started: deterministic settings, device, process group.

    Args:
        backend: ``"auto"`` (``labkit.launcher.device_rule``: CUDA when every host of the
            job has a GPU per worker, else the CPU, for every rank alike) or a name.
        timeout_s: the process group's collective timeout.

    Returns:
        This process's ``Env``.

    Raises:
        RuntimeError: not started by torchrun (``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` unset).
    """
    missing = [k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK") if k not in os.environ]
    if missing:
        script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else ""
        module = f"labkit.scripts.{script}" if script.startswith("train_") else "<script>"
        raise RuntimeError(
            f"{', '.join(missing)} not set: start this script with torchrun, e.g. "
            f"`torchrun --standalone --nproc-per-node 2 -m {module}` (its docstring has more)"
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    restart_count = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    choice, gpu_index, hosts = _choose(backend, rank, world_size, restart_count, timeout_s)
    if choice.note and rank == 0:
        print(f"[rank 0] note: {choice.note}", file=sys.stderr, flush=True)
    if choice.device == "cuda":
        device = torch.device("cuda", gpu_index)
        torch.cuda.set_device(device)
        # Deterministic cuBLAS needs this set before the first cuBLAS call.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)  # one thread per rank: no oversubscription, fixed op order
    torch.use_deterministic_algorithms(True)
    set_rank_context(rank, world_size, device, choice.backend)
    return Env(rank, world_size, local_rank, restart_count, device)


def _choose(
    backend: str, rank: int, world_size: int, restart_count: int, timeout_s: float
) -> tuple[Choice, int, list]:
    """Create the process group, then take the device decision that every rank shares.

    The rule is ``labkit.launcher.device_rule``'s. A rank alone cannot apply it: "one GPU per
    rank" is a fact about every host of the job, and two torchrun agents on one host both
    number their workers from local rank 0. So every rank publishes its host (hostname and
    ``CUDA_VISIBLE_DEVICES``) and GPU count, and all take the same decision from the same
    list: on one GPU with two workers both run on the CPU instead of one taking NCCL and the
    other gloo (a hang until the timeout), and two agents on one host get different GPUs.

    Returns:
        ``(choice, this rank's GPU index, every rank's (host, GPUs))``; the choice's backend
        is the one the group was created with.
    """
    name = backend.lower()
    nccl = dist.is_nccl_available()
    # "auto": PyTorch's multi-device backend whenever the build has NCCL (the same string on
    # every rank of a job that shares an installation), so the device can be chosen later.
    created = (MULTI_DEVICE if nccl else "gloo") if name == "auto" else name
    timeout = timedelta(seconds=timeout_s)
    dist.init_process_group(
        created,
        store=_attempt_store(rank, world_size, restart_count, timeout),
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    mine = (f"{socket.gethostname()}|{os.environ.get('CUDA_VISIBLE_DEVICES', '')}", _gpus())
    hosts: list = [None] * world_size
    # Object collectives run on CPU tensors: gloo, or a side gloo group under another backend.
    side = None if created in ("gloo", MULTI_DEVICE) else dist.new_group(backend="gloo")
    dist.all_gather_object(hosts, mine, group=side)
    if side is not None:
        dist.destroy_process_group(side)
    choice, index = choose_for_job(name, "auto", hosts, rank, nccl)
    return Choice(created, choice.device, choice.note), index, hosts


def _gpus() -> int:
    """GPUs this process may use (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _attempt_store(
    rank: int, world_size: int, restart_count: int, timeout: timedelta
) -> dist.Store | None:
    """The store for ``init_process_group``: None (``env://``) unless torchrun's is stale.

    Since torch 2.5 the c10d rendezvous shares the agent's TCPStore with the workers
    (``TORCHELASTIC_USE_AGENT_STORE=True``) and keeps it across restarts, but the workers'
    keys carry no attempt number: after a restart gloo can read the address a dead worker
    of the previous attempt published and fail with "Connection refused" (pytorch/pytorch
    #135712, #167288). On one node every worker's ``TORCHELASTIC_RESTART_COUNT`` is the
    same, so a per-attempt prefix separates the attempts. On several nodes the count is
    per agent (an agent restarted by another node's failure keeps its count), so there the
    fix is ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` in every agent's environment (a new
    store per round), and this only warns.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) != 1:
        if rank == 0 and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
            print(
                "[rank 0] warning: restarts on several nodes with torchrun's shared store "
                "can reuse a dead worker's address (pytorch/pytorch#135712); set "
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 for torchrun on every node",
                file=sys.stderr,
                flush=True,
            )
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size,
        is_master=False,
        timeout=timeout,
    )
    return dist.PrefixStore(f"labkit/attempt_{restart_count}/", store)


def digest(model: nn.Module) -> tuple[str, float]:
    """A bitwise checksum of a model's state: sha256 of every tensor's bytes, and their sum.

    Args:
        model: the (unwrapped) model.

    Returns:
        ``(sha256 hex digest over the state_dict in key order, float64 sum of all entries)``.
    """
    h = hashlib.sha256()
    total = 0.0
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(name.encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        total += float(t.double().sum())
    return h.hexdigest(), total


def finish(env: Env, model: nn.Module, out: str | None, extra: dict | None = None) -> None:
    """Print the final checksum, save rank 0's parameters to ``out``, leave the group.

    Args:
        env: from ``init``.
        model: the trained (unwrapped) model; its state_dict is what gets saved.
        out: file for ``torch.save({"params": state_dict, **extra})`` by rank 0, or None.
        extra: more plain data to save with the parameters.
    """
    sha, total = digest(model)
    print(f"[rank {env.rank}] final params sha256={sha} sum={total:.10f}", flush=True)
    if out and env.rank == 0:
        params = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        torch.save({"params": params, "sha256": sha, **(extra or {})}, out)
    dist.barrier()
    # Whatever holds the group (DDP's reducer, pending Work) goes before the group does.
    gc.collect()
    dist.destroy_process_group()


def run(main: Callable[[list[str] | None], int]) -> None:
    """Run ``main`` and leave with ``os._exit``: skip the interpreter's teardown.

    gloo can abort a process (``terminate called without an active exception``) during the
    interpreter's exit after ``destroy_process_group`` has returned (seen in a few percent of
    runs on our machines). Under torchrun that abort would count as a failed worker and
    trigger a restart, so the scripts flush their output and end with ``os._exit``.

    Args:
        main: the script's ``main(argv) -> exit code``.
    """
    code = main(None)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
