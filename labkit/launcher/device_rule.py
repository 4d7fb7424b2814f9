"""The one rule that turns ``backend="auto"`` and ``device="auto"`` into a backend and a device.

Introduced in notebooks/00_setup_and_launcher.ipynb; used by ``lk.launch``, ``%%ranks``
(both through ``labkit.launcher._checks.make_plan``) and the torchrun lab scripts
(``labkit.scripts._common.init``).

The device decides and the backend follows it:

- ``device="auto"`` is CUDA when every rank can have a GPU of its own, else the CPU. NCCL
  cannot put two ranks of one communicator on one GPU, so "enough GPUs" means at least one per
  rank (on each host, for torchrun jobs); with fewer the ranks run on the CPU and the reason is
  said, never silently.
- ``backend="auto"`` on CUDA is PyTorch's multi-device backend ``"cpu:gloo,cuda:nccl"``: one
  process group in which CUDA tensors go over NCCL and CPU tensors over gloo (the
  ``init_process_group`` documentation, "backend" argument; it is PyTorch's own default when no
  backend is given). So code that makes a CPU tensor (a counter, a flag, a timing) still works
  in a job that runs on GPUs. On the CPU it is ``"gloo"``.
- An explicit ``backend="nccl"`` stays pure NCCL (CUDA tensors only) and needs one GPU per
  rank; an explicit ``device="cuda"`` needs the same.

Code inside a rank asks "are my tensors on a GPU?" with ``lk.get_device().type == "cuda"``,
never with the backend's name: under the rule ``dist.get_backend()`` returns
``"cpu:gloo,cuda:nccl"``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MULTI_DEVICE = "cpu:gloo,cuda:nccl"

# labkit's backends that register for CPU tensors only (``devices=["cpu"]``): a CUDA tensor
# reaches them only to fail at its first operation with torch's generic "no backend" error.
CPU_ONLY_BACKENDS = ("labkit_shm", "labkit_cpp")


@dataclass(frozen=True)
class Choice:
    """What a launch runs on: the ``init_process_group`` backend and the ranks' device type.

    Attributes:
        backend: the backend string for ``init_process_group`` (``"gloo"``, ``"nccl"``,
            ``"cpu:gloo,cuda:nccl"``, ``"labkit_shm"``, ...).
        device: ``"cpu"`` or ``"cuda"`` (rank r of a launch on GPU r).
        note: why ``"auto"`` chose the CPU although GPUs are there ("" otherwise): shown to
            the user, so nothing falls back silently.
    """

    backend: str
    device: str
    note: str = ""


def choose(backend: str, device: str, world_size: int, gpus: int, nccl: bool) -> Choice:
    """Apply the rule to one launch on one host.

    Args:
        backend: a backend name as given (``"auto"``, ``"gloo"``, ``"nccl"``, a labkit one...).
        device: ``"auto"``, ``"cpu"`` or ``"cuda"``.
        world_size: ranks on this host.
        gpus: GPUs this process can use (``torch.cuda.device_count()``).
        nccl: whether this torch build has NCCL (``dist.is_nccl_available()``).

    Returns:
        The ``Choice``.

    Raises:
        ValueError: a device that is not auto/cpu/cuda, or one the backend cannot serve.
        RuntimeError: NCCL or CUDA asked for where there is not one GPU per rank.
    """
    name = backend.lower()
    if device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    enough = gpus >= world_size
    if name == "nccl":
        if not nccl:
            raise RuntimeError(
                "backend='nccl' needs NVIDIA GPUs and a CUDA build of PyTorch; this build has "
                "no NCCL. Use backend='gloo' (CPU)."
            )
        if device == "cpu":
            raise ValueError("backend='nccl' works on CUDA tensors only; use device='cuda'")
        _need_gpus("backend='nccl'", world_size, gpus)
        return Choice("nccl", "cuda")
    if device == "cuda":
        if name in CPU_ONLY_BACKENDS:
            raise ValueError(
                f"backend={backend!r} moves CPU tensors only (its ranks exchange host memory); "
                "it cannot serve device='cuda'. Use device='cpu' with it, or backend='nccl' "
                "(or 'auto') for CUDA tensors."
            )
        _need_gpus("device='cuda'", world_size, gpus)
        if name == "auto":
            return Choice(MULTI_DEVICE if nccl else "gloo", "cuda")
        return Choice(name, "cuda")
    if name != "auto" or device == "cpu":
        return Choice("gloo" if name == "auto" else name, "cpu")
    if enough and gpus > 0 and nccl:
        return Choice(MULTI_DEVICE, "cuda")
    note = ""
    if gpus > 0:
        note = (
            f"device='auto': {world_size} ranks but {gpus} GPU(s), and NCCL needs one GPU per "
            "rank, so the ranks run on the CPU over gloo"
            if nccl
            else f"device='auto': {gpus} GPU(s) but this torch build has no NCCL, so the ranks "
            "run on the CPU over gloo"
        )
    return Choice("gloo", "cpu", note)


def _need_gpus(what: str, world_size: int, gpus: int) -> None:
    if gpus < world_size:
        raise RuntimeError(
            f"{what} puts rank r on GPU r: world_size={world_size} needs {world_size} GPUs, "
            f"this machine has {gpus}. Use device='cpu' (gloo) or at most {max(gpus, 1)} ranks."
        )


def choose_for_job(
    backend: str, device: str, hosts: Sequence[tuple[str, int]], rank: int, nccl: bool
) -> tuple[Choice, int]:
    """Apply the rule to a torchrun job from every rank's view of its host.

    Every rank calls this with the same ``hosts`` (gathered from all ranks), so every rank
    takes the same decision: CUDA only if each host has a GPU for each of its ranks. Ranks
    that share a host *and* the same ``CUDA_VISIBLE_DEVICES`` share GPUs, so they are
    numbered together: two torchrun agents on one host (two "nodes" over loopback) get
    GPUs 0, 1 and 2, 3, not 0, 1 twice.

    Args:
        backend: as for ``choose``.
        device: as for ``choose``.
        hosts: for every global rank, ``(host key, GPUs visible to it)``; the key is the
            hostname and the value of ``CUDA_VISIBLE_DEVICES``.
        rank: this process's global rank.
        nccl: whether this torch build has NCCL.

    Returns:
        ``(choice, GPU index for this rank)`` (index 0 on the CPU).

    Raises:
        ValueError / RuntimeError: as for ``choose``, on every rank alike.
    """
    per_host = Counter(key for key, _ in hosts)
    # The tightest host decides: the one with the fewest GPUs per rank.
    key, gpus = min(hosts, key=lambda h: (h[1] - per_host[h[0]], h[0]))
    choice = choose(backend, device, per_host[key], gpus, nccl)
    if choice.note and len(per_host) > 1:
        choice = Choice(choice.backend, choice.device, f"{choice.note} (host {key!r})")
    mine = hosts[rank][0]
    index = sum(1 for k, _ in hosts[:rank] if k == mine)
    return choice, index if choice.device == "cuda" else 0
