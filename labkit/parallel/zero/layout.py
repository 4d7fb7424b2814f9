"""Where each rank's shard lies: per-parameter padded shards, grouped into units (layers).

Introduced in notebooks/13_zero_and_fsdp.ipynb.

Every trainable parameter of N elements is flattened and padded with zeros to a multiple of
the data-parallel degree N_d; rank r owns elements [r·s, (r+1)·s) with s = ⌈N/N_d⌉ — the
``padding="per_parameter"`` mode of ``labkit.memory.zero_rank_bytes``, and the way FSDP2
shards each parameter on its own. A *unit* is one module with parameters of its own (a
``Linear``): ZeRO communicates once per unit, packing its parameters' pieces side by side
(FSDP2 does the same per ``fully_shard`` group).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["Unit", "find_units", "shard_bounds", "shard_size"]


def shard_size(numel: int, world_size: int) -> int:
    """Elements per rank of one parameter: ⌈numel / world_size⌉ (padding included).

    Args:
        numel: elements of the parameter.
        world_size: N_d, the data-parallel degree.

    Returns:
        s, so that the parameter padded to s · world_size elements splits evenly.

    Raises:
        ValueError: ``numel`` < 0 or ``world_size`` < 1.
    """
    if numel < 0 or world_size < 1:
        raise ValueError(f"need numel >= 0 and world_size >= 1, got {numel}, {world_size}")
    return max(1, -(-numel // world_size))


def shard_bounds(numel: int, world_size: int, rank: int) -> tuple[int, int]:
    """The slice [start, end) of the padded flat parameter that ``rank`` owns.

    ZeRO, Rajbhandari et al. 2020, §5.1: each of the N_d ranks updates 1/N_d of the states.
    ``end`` may pass ``numel``: the elements beyond it are padding (zeros), so every rank's
    shard has the same length, which ``all_gather_into_tensor`` and ``reduce_scatter_tensor``
    need.

    Args:
        numel: elements of the parameter.
        world_size: N_d.
        rank: this rank's index in the data-parallel group.

    Returns:
        ``(rank · s, (rank + 1) · s)`` with s = ``shard_size(numel, world_size)``.

    Raises:
        ValueError: ``rank`` outside [0, world_size).
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
    s = shard_size(numel, world_size)
    return rank * s, (rank + 1) * s


@dataclass
class Unit:
    """One module whose own parameters are gathered and reduced together.

    Attributes:
        name: the module's qualified name ("" for the root).
        module: the module.
        names: its parameters' local names (``weight``, ``bias``).
        params: the full parameters, in that order.
        shard_sizes: s per parameter; the unit's packed shard is their concatenation.
        offsets: where each parameter's piece starts in the packed shard.
    """

    name: str
    module: nn.Module
    names: list[str]
    params: list[nn.Parameter]
    shard_sizes: list[int]
    offsets: list[int]

    @property
    def shard_numel(self) -> int:
        """S, the length of the unit's packed shard on every rank."""
        return sum(self.shard_sizes)

    def pack(self, flats: list[torch.Tensor], world_size: int) -> torch.Tensor:
        """(world_size, S): row r holds rank r's piece of every parameter (zeros as padding).

        Args:
            flats: one 1-D tensor per parameter (its N elements).
            world_size: N_d.

        Returns:
            The packed buffer; ``.view(-1)`` is a ``reduce_scatter_tensor`` input.
        """
        out = flats[0].new_zeros(world_size, self.shard_numel)
        for flat, s, off in zip(flats, self.shard_sizes, self.offsets, strict=True):
            padded = flat.new_zeros(world_size * s)
            padded[: flat.numel()] = flat
            out[:, off : off + s] = padded.view(world_size, s)
        return out

    def unpack(self, packed: torch.Tensor) -> list[torch.Tensor]:
        """The full parameters from a (world_size, S) buffer.

        Args:
            packed: what ``all_gather_into_tensor`` wrote, viewed as (world_size, S).

        Returns:
            One new tensor per parameter, shaped like it.
        """
        return [
            packed[:, off : off + s].reshape(-1)[: p.numel()].view(p.shape)
            for p, s, off in zip(self.params, self.shard_sizes, self.offsets, strict=True)
        ]


def find_units(module: nn.Module, world_size: int) -> list[Unit]:
    """Every module with trainable parameters of its own, in registration order.

    Args:
        module: the model.
        world_size: N_d (sets each parameter's shard size).

    Returns:
        The units; together they hold every trainable parameter exactly once.

    Raises:
        ValueError: no trainable parameters, or a parameter shared by two modules.
    """
    units, seen = [], set()
    for name, mod in module.named_modules():
        own = [(n, p) for n, p in mod.named_parameters(recurse=False) if p.requires_grad]
        if not own:
            continue
        for _, p in own:
            if id(p) in seen:
                raise ValueError(f"parameter of {name!r} is shared with another module")
            seen.add(id(p))
        sizes = [shard_size(p.numel(), world_size) for _, p in own]
        offsets = [sum(sizes[:i]) for i in range(len(sizes))]
        units.append(Unit(name, mod, [n for n, _ in own], [p for _, p in own], sizes, offsets))
    if not units:
        raise ValueError("the module has no trainable parameters")
    return units
