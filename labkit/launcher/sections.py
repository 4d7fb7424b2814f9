"""Where a notebook's GPU-only sections and CPU-only labs run, and the note that says so.

Introduced in notebooks/04_custom_backend.ipynb (``lk.cpu_lab``) and
notebooks/06_data_parallel.ipynb (``lk.section_gpus``).

``lk.fit_ranks`` fits the lesson's world to the machine; two kinds of cells stand outside it,
and both follow the notebook's ``device`` parameter *as the learner set it* (``fit_ranks`` may
have moved the lesson itself to the CPU because its world does not fit the GPUs; a section
sized to the GPUs still fits them):

- **GPU-only sections** (DataParallel against DDP, ``nn.SyncBatchNorm``, the CUDA allocator's
  counts, NCCL's streams in a trace) run on GPUs only when ``device`` is ``"auto"`` or
  ``"cuda"`` and enough GPUs are visible; otherwise ``section_gpus`` says why they are skipped.
  ``labkit course run --device cpu`` keeps every one of them off the GPUs.
- **CPU labs** (a notebook whose models are CPU tensors by design) run on a CPU backend, and
  ``cpu_lab`` says so whenever GPUs could have been expected: ``device="cuda"`` or
  ``backend="nccl"`` asked for, or ``"auto"`` on a machine with GPUs. Nothing falls back
  silently (``labkit.launcher.device_rule``).
"""

from __future__ import annotations

import sys

from labkit.launcher.device_rule import MULTI_DEVICE

DEVICES = ("auto", "cpu", "cuda")


def gpu_count() -> int:
    """CUDA GPUs this process's torch can use, counted without initialising CUDA here.

    ``labkit.launcher._gpus.gpu_count`` (NVML, then a subprocess that asks torch): the count
    ``device="auto"`` decides from.

    Returns:
        The number of usable GPUs (0 on a CPU build or without a GPU).
    """
    from labkit.launcher._gpus import gpu_count as count

    return count()


def section_gpus(device: str, need: int = 1, what: str = "this section") -> int:
    """How many GPUs a notebook's GPU-only section may use: all visible ones, or 0 (said why).

    Args:
        device: the notebook's ``device`` parameter as given (``"auto"``, ``"cpu"``,
            ``"cuda"``), not the one ``lk.fit_ranks`` fitted to the lesson's world.
        need: the fewest GPUs the section can run on (2 for anything over NCCL: one per rank).
        what: the section, for the message (e.g. ``"nn.SyncBatchNorm over NCCL"``).

    Returns:
        The visible GPUs (at least ``need``) when the section runs on them, else 0 after
        printing ``skipped: <what>: <reason>``.

    Raises:
        ValueError: a device other than auto/cpu/cuda, or ``need`` below 1.
    """
    if device not in DEVICES:
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")
    if isinstance(need, bool) or not isinstance(need, int) or need < 1:
        raise ValueError(f"need must be a positive integer, got {need!r}")
    if device == "cpu":
        print(f"skipped: {what}: device='cpu' keeps this notebook off the GPUs", flush=True)
        return 0
    gpus = gpu_count()
    if gpus >= need:
        return gpus
    have = f"{gpus} GPU(s) visible" if gpus else "no GPU visible"
    print(f"skipped: {what}: it needs {need} GPU(s), {have}", flush=True)
    return 0


def cpu_lab(backend: str, device: str, what: str = "this notebook's models") -> str:
    """The backend of a lab that runs on CPU tensors by design; says so where GPUs are about.

    A lab whose models live on the CPU launches on gloo (or on the labkit backend the learner
    named). Where the learner could have expected GPUs — ``device="cuda"``, ``backend="nccl"``
    or the multi-device backend, or ``"auto"`` on a machine with GPUs — a note on stderr says
    that the lab runs on the CPU, as ``lk.fit_ranks``'s notes do.

    Args:
        backend: the notebook's ``backend`` parameter (after ``lk.fit_ranks``).
        device: the notebook's ``device`` parameter (after ``lk.fit_ranks``).
        what: what runs on the CPU, for the note.

    Returns:
        ``"gloo"`` for ``"auto"``, ``"nccl"`` and ``"cpu:gloo,cuda:nccl"``; else ``backend``.
    """
    name = str(backend).lower()
    cpu_backend = "gloo" if name in ("auto", "nccl", MULTI_DEVICE) else backend
    if device == "cuda" or name in ("nccl", MULTI_DEVICE):
        why = f"device={device!r}, backend={backend!r} asked for"
    elif device == "auto" and name == "auto" and (gpus := gpu_count()):
        why = f"{gpus} GPU(s) visible and device='auto'"
    else:
        return cpu_backend  # the CPU was asked for, or no GPU is here: nothing to say
    print(
        f"note: {why}, but {what} run on CPU tensors: they run on the CPU over {cpu_backend}",
        file=sys.stderr,
        flush=True,
    )
    return cpu_backend
