"""The dp × pp × tp rank grid: degrees, coordinates, groups, in one place and without torch.

Introduced in notebooks/18_hybrid_parallel.ipynb; the capstone (notebooks/21_capstone.ipynb),
the planner (``labkit.planner``) and ``labkit.mesh`` all lay their ranks out with it.

``ParallelDims(dp, pp, tp)`` names how the ranks are shared among data, pipeline and tensor
parallelism (modelled on torchtitan's ``torchtitan/distributed/parallel_dims.py``; Narayanan
et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM", §3: PTD-P). The ranks form a row-major grid of shape (dp, pp, tp):

    rank = (dp_rank · pp + pp_rank) · tp + tp_rank

so **tp is innermost** and a tensor-parallel group is ``tp`` consecutive ranks. Tensor
parallelism communicates the most (an all-reduce of the activations in every layer, Shoeybi
et al. 2019, §3), and launchers number the processes of one node consecutively, so on a GPU
box a tp group is a set of NVLink neighbours; a pipeline group strides by ``tp`` and a
data-parallel group by ``pp · tp``, the least frequent traffic crossing the widest span.
``torch.distributed.device_mesh.init_device_mesh`` lays out a mesh of shape (dp, pp, tp) the
same way (row-major), so ``labkit.mesh.build_mesh`` gets these groups. torchtitan keeps tp
innermost too but puts pp outermost (its mesh is ``pp, dp_replicate, dp_shard, cp, tp``);
this course puts dp outermost, as Megatron's PTD-P figures draw it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

__all__ = ["AXES", "ParallelDims"]

AXES = ("dp", "pp", "tp")  # outermost to innermost


@dataclass(frozen=True)
class ParallelDims:
    """Data-, pipeline- and tensor-parallel degrees whose product is the world size.

    Pure arithmetic: no process group, no torch. The layout is the module's docstring (tp
    innermost).

    Args:
        dp: data-parallel degree (replicas, each on its own share of the batch).
        pp: pipeline-parallel degree (stages).
        tp: tensor-parallel degree (shards of every layer).
        world_size: the number of ranks (None: dp·pp·tp).

    Raises:
        ValueError: a degree that is not an int ≥ 1 (the message names it), or
            dp·pp·tp ≠ world_size (the message shows the arithmetic and the factorizations
            that would fit).
    """

    dp: int
    pp: int = 1
    tp: int = 1
    world_size: int | None = None

    def __post_init__(self) -> None:
        for axis in (*AXES, "world_size"):
            v = getattr(self, axis)
            if v is None and axis == "world_size":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{axis} must be an int >= 1, got {v!r}")
        n = self.dp * self.pp * self.tp
        if self.world_size is None:
            object.__setattr__(self, "world_size", n)
        elif n != self.world_size:
            w = self.world_size
            fits = [f"dp={w // (p * t)}, pp={p}, tp={t}" for p, t in _pp_tp_pairs(w)]
            raise ValueError(
                f"dp({self.dp}) * pp({self.pp}) * tp({self.tp}) = {n} != "
                f"world_size({w}): choose degrees whose product is the number of ranks, "
                f"e.g. {'; '.join(fits[:6])}"
            )

    # --- degrees ---------------------------------------------------------------------------
    def degree(self, axis: str) -> int:
        """The degree of ``axis``.

        Args:
            axis: ``"dp"``, ``"pp"`` or ``"tp"``.

        Returns:
            The number of ranks in one group of ``axis``.

        Raises:
            ValueError: an unknown axis.
        """
        if axis not in AXES:
            raise ValueError(f"unknown axis {axis!r}; axes: {AXES}")
        return getattr(self, axis)

    @property
    def dp_enabled(self) -> bool:
        """Whether there is more than one data-parallel replica."""
        return self.dp > 1

    @property
    def pp_enabled(self) -> bool:
        """Whether the model is cut into more than one pipeline stage."""
        return self.pp > 1

    @property
    def tp_enabled(self) -> bool:
        """Whether every layer is split over more than one rank."""
        return self.tp > 1

    @property
    def label(self) -> str:
        """``"dp2·pp1·tp2"``: the prefix of the planner's and the capstone's labels."""
        return f"dp{self.dp}·pp{self.pp}·tp{self.tp}"

    @property
    def mesh_axes(self) -> tuple[str, ...]:
        """The axes of degree > 1, in grid order (``("dp",)`` when every degree is 1)."""
        return tuple(a for a in AXES if self.degree(a) > 1) or ("dp",)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The degrees of ``mesh_axes``."""
        return tuple(self.degree(a) for a in self.mesh_axes)

    def stride(self, axis: str) -> int:
        """How far apart in rank two neighbours along ``axis`` are: tp 1, pp tp, dp pp·tp."""
        self.degree(axis)
        return math.prod(self.degree(a) for a in AXES[AXES.index(axis) + 1 :])

    # --- rank <-> coordinates ----------------------------------------------------------------
    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s position on each axis.

        Args:
            rank: a global rank, 0 ≤ rank < world_size.

        Returns:
            ``{"dp": dp_rank, "pp": pp_rank, "tp": tp_rank}``.

        Raises:
            ValueError: ``rank`` outside the grid.
        """
        n = self.world_size
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
            raise ValueError(
                f"rank {rank!r} is outside the {self.label} grid: not in 0..{self.world_size - 1}"
            )
        return {a: rank // self.stride(a) % self.degree(a) for a in AXES}

    def rank(self, dp: int = 0, pp: int = 0, tp: int = 0) -> int:
        """The global rank at coordinates ``(dp, pp, tp)``: ``(dp·PP + pp)·TP + tp``.

        Args:
            dp, pp, tp: the coordinates, each in ``0..degree − 1``.

        Returns:
            The rank; ``coordinates(rank(**c)) == c``.

        Raises:
            ValueError: a coordinate outside its axis (the message names the axis).
        """
        coords = {"dp": dp, "pp": pp, "tp": tp}
        for a, c in coords.items():
            n = self.degree(a)
            if isinstance(c, bool) or not isinstance(c, int) or not 0 <= c < n:
                raise ValueError(f"{a} coordinate {c!r} is not in 0..{n - 1} ({self.label})")
        return sum(c * self.stride(a) for a, c in coords.items())

    # --- groups ------------------------------------------------------------------------------
    def groups(self, axis: str) -> list[list[int]]:
        """Every group of ``axis``: the ranks that differ only in their ``axis`` coordinate.

        Pure arithmetic, checked against ``init_device_mesh``'s own groups in tests/test_mesh.py.

        Args:
            axis: ``"dp"``, ``"pp"`` or ``"tp"``.

        Returns:
            ``world_size / degree(axis)`` lists of ``degree(axis)`` ranks, each sorted, the
            lists ordered by their first rank; together they partition the ranks.

        Raises:
            ValueError: an unknown axis.
        """
        n, step = self.degree(axis), self.stride(axis)
        others = [range(self.degree(a)) for a in AXES if a != axis]
        names = [a for a in AXES if a != axis]
        firsts = sorted(self.rank(**dict(zip(names, c, strict=True))) for c in product(*others))
        return [[first + i * step for i in range(n)] for first in firsts]

    group_ranks = groups  # the name notebooks/18_hybrid_parallel.ipynb and its exercise use

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The ranks of ``rank``'s group along ``axis`` (``rank`` among them).

        Args:
            rank: a global rank.
            axis: ``"dp"``, ``"pp"`` or ``"tp"``.

        Returns:
            The sorted ranks sharing every other coordinate with ``rank``.

        Raises:
            ValueError: ``rank`` outside the grid or an unknown axis.
        """
        c = self.coordinates(rank)
        first = rank - c[axis] * self.stride(axis)
        return [first + i * self.stride(axis) for i in range(self.degree(axis))]

    def expert_groups(self, ep: int) -> tuple[list[list[int]], list[list[int]]]:
        """Expert parallelism inside the dp axis: the ep groups and the expert-dp groups.

        Expert parallelism borrows its ranks from data parallelism, as torchtitan's
        ``ParallelDims`` does (its ``ep`` divides the data-parallel shard degree): every dp rank
        keeps its own tokens; in each dp group, ``ep`` consecutive dp ranks share the experts
        among them (an **ep group**: the ranks of the all-to-all), and ranks ``ep`` apart hold
        the same experts (an **expert-dp group**: where the experts' gradients are summed).
        The dense layers and the router stay replicated over the whole dp group.

        Args:
            ep: ranks per ep group; divides ``dp``.

        Returns:
            ``(ep_groups, edp_groups)``: each a list of sorted rank lists ordered by first rank;
            each partitions the ranks. ``dp=4, ep=2``: ``[[0, 1], [2, 3]]``, ``[[0, 2], [1, 3]]``.

        Raises:
            ValueError: ``ep`` is not an int ≥ 1 dividing ``dp``.
        """
        if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1 or self.dp % ep:
            raise ValueError(f"ep must be an int >= 1 dividing dp({self.dp}), got {ep!r}")
        ep_groups, edp_groups = [], []
        for g in self.groups("dp"):
            ep_groups += [g[i : i + ep] for i in range(0, len(g), ep)]
            edp_groups += [g[j::ep] for j in range(ep)]
        return sorted(ep_groups), sorted(edp_groups)

    def nodes_spanned(self, axis: str, per_node: int) -> int:
        """The most nodes any group of ``axis`` touches, with ranks numbered node by node.

        A launcher (torchrun, ``lk.launch``) gives node k the ranks
        ``k·per_node .. (k+1)·per_node − 1``; a group spanning one node communicates over the
        node's own links (NVLink on a GPU box).

        Args:
            axis: ``"dp"``, ``"pp"`` or ``"tp"``.
            per_node: ranks per node, ≥ 1.

        Returns:
            1 when every group of ``axis`` lies inside one node, else the largest count.

        Raises:
            ValueError: ``per_node`` < 1 or an unknown axis.
        """
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise ValueError(f"per_node must be an int >= 1, got {per_node!r}")
        return max(len({r // per_node for r in g}) for g in self.groups(axis))


def _pp_tp_pairs(n: int) -> list[tuple[int, int]]:
    """Every (pp, tp) with pp·tp dividing n."""
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return [(p, t) for p in divisors for t in divisors if n % (p * t) == 0]
