"""What every ZeRO stage shares: the units, the sharded Adam, and counting the bytes held.

Introduced in notebooks/13_zero_and_fsdp.ipynb. Also ``GradientShards``, the part stages 2 and
3 share: each unit's gradients reduce-scattered during backward into this rank's shard.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from labkit.memory import MemoryBreakdown, zero_rank_bytes
from labkit.parallel.ddp.naive import broadcast_state
from labkit.parallel.zero.comm import reduce_scatter_unit
from labkit.parallel.zero.layout import Unit, find_units

__all__ = ["GradientShards", "ZeroBase", "storage_bytes"]


def storage_bytes(tensors: Iterable[torch.Tensor | None], seen: set[int] | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (views of one buffer count once).

    Args:
        tensors: tensors (``None`` entries are skipped).
        seen: storage addresses already counted elsewhere; updated in place.

    Returns:
        The sum of ``untyped_storage().nbytes()`` over storages not in ``seen``; a storage
        resized to 0 bytes (a freed full parameter) adds nothing.
    """
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None:
            continue
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


class _FullParams:
    """Stands in for the module in ``zero_rank_bytes``: the full parameters' sizes and dtypes."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self._params = params

    def parameters(self) -> list[nn.Parameter]:
        return self._params


class ZeroBase:
    """The part of every ZeRO stage that does not depend on what is sharded.

    Finds the units (``find_units``), broadcasts the module's state from the group's first
    rank (ranks start identical, as with DDP), builds ``torch.optim.Adam`` over this rank's
    shard parameters (``self.shards``, made by the subclass), and measures the bytes held.

    Args:
        module: the model on this rank (hooks are added to it; no wrapper module).
        group: the data-parallel group (None: the default group).
        lr, betas, eps, weight_decay: ``torch.optim.Adam``'s arguments.
    """

    stage: int  # 1, 2 or 3: set by each stage's class

    def __init__(
        self,
        module: nn.Module,
        group: dist.ProcessGroup | None = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        self.module, self.group = module, group
        self.dp_world_size = dist.get_world_size(group)
        self.dp_rank = dist.get_rank(group)
        self.sync = True  # False inside no_sync(): backward keeps full gradients, no collective
        broadcast_state(module, group)
        self.units: list[Unit] = find_units(module, self.dp_world_size)
        self.full_params = [p for u in self.units for p in u.params]
        self.n_params = sum(p.numel() for p in self.full_params)
        self.shards: list[nn.Parameter] = self._shard()  # this rank's pieces, unit by unit
        self.optimizer = torch.optim.Adam(
            self.shards, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay
        )
        self.peak_bytes = 0
        self.observe()

    # --- to be provided by each stage --------------------------------------------------
    def _shard(self) -> list[nn.Parameter]:
        raise NotImplementedError

    def _param_tensors(self) -> list[torch.Tensor | None]:
        raise NotImplementedError

    def _grad_tensors(self) -> list[torch.Tensor | None]:
        raise NotImplementedError

    # --- bytes held --------------------------------------------------------------------
    def _optimizer_tensors(self) -> list[torch.Tensor]:
        return [t for st in self.optimizer.state.values() for t in st.values()]

    def held_tensors(self) -> list[torch.Tensor]:
        """Every tensor this rank keeps for its model states, views included.

        Parameters (full buffers or shards), gradients, every tensor of Adam's state; what
        ``rank_bytes`` counts, for a count of another kind (e.g. the CUDA allocator's blocks,
        ``lk.profile.cuda_tensor_bytes``).

        Returns:
            The tensors (a storage may appear more than once, as views).
        """
        held = [*self._param_tensors(), *self._grad_tensors(), *self._optimizer_tensors()]
        return [t for t in held if t is not None]

    def rank_bytes(self, extra: Iterable[torch.Tensor] = ()) -> MemoryBreakdown:
        """Bytes this rank holds now: parameters, gradients, optimizer states (measured).

        Counts the storages of the tensors the implementation keeps alive (each storage
        once); ``extra`` (temporary buffers of a collective) is added to the parameters.

        Args:
            extra: temporaries alive at this moment.

        Returns:
            A ``labkit.memory.MemoryBreakdown`` with measured bytes.
        """
        seen: set[int] = set()
        params = storage_bytes([*self._param_tensors(), *extra], seen)
        grads = storage_bytes(self._grad_tensors(), seen)
        optim = storage_bytes(self._optimizer_tensors(), seen)
        return MemoryBreakdown(
            self.stage, float(self.n_params), self.dp_world_size, params, grads, optim
        )

    def observe(self, extra: Iterable[torch.Tensor] = ()) -> int:
        """Count the bytes held now and raise ``peak_bytes`` if they are a new high.

        Args:
            extra: temporaries alive at this moment.

        Returns:
            The bytes held now.
        """
        now = int(self.rank_bytes(extra).total_bytes)
        self.peak_bytes = max(self.peak_bytes, now)
        return now

    def model_bytes(self) -> MemoryBreakdown:
        """What ``labkit.memory.zero_rank_bytes`` predicts this rank holds at rest.

        Per-parameter padded shards (``padding="per_parameter"``), Adam's two fp32 states.

        Returns:
            The model's ``MemoryBreakdown`` for this stage and data-parallel degree.
        """
        return zero_rank_bytes(
            _FullParams(self.full_params),
            self.dp_world_size,
            self.stage,
            padding="per_parameter",
        )

    # --- the training loop's calls ------------------------------------------------------
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside this block backward only accumulates full gradients: no reduce-scatter.

        Gradient accumulation (notebook 09's ``no_sync``, for ZeRO): the micro-batches before
        the last keep their gradients in the full ``.grad`` of each parameter (stage 3 still
        frees the gathered parameters), and the last backward, outside the block,
        reduce-scatters what has accumulated: one reduce-scatter per unit per optimizer step.
        Stage 1 reduces in ``step()`` anyway, so the block changes nothing there.

        Returns:
            A context manager.
        """
        old, self.sync = self.sync, False
        try:
            yield
        finally:
            self.sync = old

    def reduce_gradients(self) -> None:
        """Make this rank's shard gradients the average over ranks (before clipping them)."""
        raise NotImplementedError

    def step(self) -> None:
        """Adam on this rank's shards (and whatever the stage communicates around it)."""
        raise NotImplementedError

    def zero_grad(self) -> None:
        """Zero the gradients this rank keeps (their buffers stay allocated)."""
        for s in self.shards:
            if s.grad is not None:
                s.grad.zero_()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter in full, as ``{qualified name: tensor}`` (copies).

        Returns:
            A dict in the module's registration order.
        """
        return {
            (f"{u.name}.{n}" if u.name else n): p.detach().clone()
            for u in self.units
            for n, p in zip(u.names, u.params, strict=True)
        }


class GradientShards:
    """This rank's gradient shard of every unit, filled by reduce-scatters during backward.

    What ZeRO stages 2 and 3 share (Rajbhandari et al. 2020, §5.2): a post-accumulate-grad
    hook on each full parameter calls ``arrive(k)``; when the last gradient of unit ``k`` has
    arrived, ``reduce(k)`` reduce-scatters the unit's full gradients, adds this rank's
    averaged piece to ``shards[k]`` and drops the full gradients (``.grad = None``).

    Args:
        zero: the stage that owns the shards (its units, group and ``observe``).
    """

    def __init__(self, zero: ZeroBase) -> None:
        self.zero = zero
        self.shards: list[torch.Tensor] = [u.params[0].new_zeros(u.shard_numel) for u in zero.units]
        self._arrived = [0] * len(zero.units)

    def arrive(self, k: int) -> bool:
        """Count one gradient of unit ``k``; True when it was the unit's last (count reset)."""
        self._arrived[k] += 1
        if self._arrived[k] < len(self.zero.units[k].params):
            return False
        self._arrived[k] = 0
        return True

    def reduce(self, k: int) -> None:
        """Reduce-scatter unit ``k``'s full gradients into its shard, then free them."""
        z, unit = self.zero, self.zero.units[k]
        with torch.no_grad():
            z.observe()  # the unit's full gradients are alive now
            grads = [p.grad for p in unit.params]
            self.shards[k].add_(reduce_scatter_unit(unit, grads, z.dp_world_size, z.group))
        for p in unit.params:
            p.grad = None

    def check_all_reduced(self) -> None:
        """Raise if a unit got some but not all of its gradients (it was never reduced).

        Raises:
            RuntimeError: naming the units left half-reduced.
        """
        units = self.zero.units
        stuck = [u.name or "(root)" for u, n in zip(units, self._arrived, strict=True) if n]
        if stuck:
            raise RuntimeError(
                f"ZeRO-{self.zero.stage}: unit(s) {stuck} received only some of their gradients "
                "in backward, so they were never reduce-scattered; every parameter of a unit "
                "must get a gradient (or none of them)"
            )

    def zero_(self) -> None:
        """Zero every gradient shard (the buffers stay allocated)."""
        for g in self.shards:
            g.zero_()
