"""A training strategy as data: the parallel degrees and the sharding, validated with arithmetic.

Introduced in notebooks/17_capstone.ipynb. No torch: a ``Strategy`` is checked, named and
compared with the planner's plans without starting a process. Its ranks are laid out by
``labkit.parallel.dims.ParallelDims`` (``Strategy.dims``), the grid ``labkit.mesh`` and the
planner use too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.parallel.dims import ParallelDims

__all__ = ["NAMES", "Strategy"]

# Strategy names a learner may pick, with what each means on p ranks.
NAMES = {
    "dp": "data parallelism on all p ranks (labkit's bucketed DDP)",
    "zero1": "ZeRO-1 on p ranks: optimizer states sharded",
    "zero2": "ZeRO-2 on p ranks: optimizer states and gradients sharded",
    "zero3": "ZeRO-3 on p ranks: parameters sharded too (labkit's from-scratch version)",
    "fsdp": "PyTorch FSDP2 (fully_shard) on p ranks: ZeRO-3",
    "pp": "a pipeline of p stages, 1F1B",
    "tp": "tensor parallelism over p ranks (Megatron-style blocks)",
    "dp_tp": "2 data-parallel replicas × tensor parallelism over p/2 ranks",
    "dp_pp": "2 data-parallel replicas × a pipeline of p/2 stages",
}


@dataclass(frozen=True)
class Strategy:
    """How a model is trained on ``dp · pp · tp`` ranks.

    Introduced in notebooks/17_capstone.ipynb.

    Ranks are laid out by ``self.dims`` (``labkit.parallel.dims.ParallelDims``), tensor
    parallelism innermost: global rank ``r = (dp_rank · pp + pp_rank) · tp + tp_rank``, so
    tensor-parallel peers are neighbours.

    Args:
        dp: data-parallel degree.
        pp: pipeline stages.
        tp: tensor-parallel degree.
        zero_stage: 0 (replicated model states) or ZeRO stage 1, 2, 3 over the dp ranks.
        fsdp: ZeRO-3 done by PyTorch's ``fully_shard`` instead of labkit's ``ZeroStage3``
            (needs ``zero_stage=3``).
        microbatches: micro-batches per step in the pipeline (1 without one).

    Raises:
        ValueError: a degree below 1, an unknown ZeRO stage, ``fsdp`` without stage 3, or a
            combination this runner does not train (ZeRO with pp or tp, pp with tp,
            micro-batches without a pipeline).
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1
    zero_stage: int = 0
    fsdp: bool = False
    microbatches: int = 1

    def __post_init__(self) -> None:
        m = self.microbatches
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"microbatches must be an int >= 1, got {m!r}")
        ParallelDims(self.dp, self.pp, self.tp)  # raises naming a bad dp, pp or tp
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.fsdp and self.zero_stage != 3:
            raise ValueError(f"fsdp is ZeRO-3: zero_stage must be 3, got {self.zero_stage}")
        if self.zero_stage and (self.pp > 1 or self.tp > 1):
            raise ValueError(
                f"ZeRO-{self.zero_stage} with pp({self.pp}) and tp({self.tp}): this runner "
                "shards model states only under pure data parallelism (pp = tp = 1)"
            )
        if self.pp > 1 and self.tp > 1:
            raise ValueError(f"pp({self.pp}) × tp({self.tp}) together is not supported here")
        if self.microbatches > 1 and self.pp == 1:
            raise ValueError(f"microbatches({self.microbatches}) > 1 needs a pipeline (pp > 1)")

    @property
    def dims(self) -> ParallelDims:
        """The degrees and the rank grid (coordinates, groups) of this strategy."""
        return ParallelDims(self.dp, self.pp, self.tp)

    @property
    def world_size(self) -> int:
        """Ranks used: dp · pp · tp."""
        return self.dims.world_size

    @property
    def name(self) -> str:
        """The short name, e.g. ``"zero2"``, ``"dp_tp"`` or ``"dp"``."""
        if self.fsdp:
            return "fsdp"
        if self.zero_stage:
            return f"zero{self.zero_stage}"
        parts = [k for k, v in (("dp", self.dp), ("pp", self.pp), ("tp", self.tp)) if v > 1]
        return "_".join(parts) or "dp"

    @property
    def label(self) -> str:
        """The planner's label, e.g. ``"dp2·pp1·tp2·zero0·m1"``."""
        return f"{self.dims.label}·zero{self.zero_stage}·m{self.microbatches}"

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_rank, pp_rank, tp_rank)`` of global rank ``rank`` (``ParallelDims``).

        Raises:
            ValueError: ``rank`` outside 0..world_size − 1.
        """
        c = self.dims.coordinates(rank)
        return c["dp"], c["pp"], c["tp"]

    @classmethod
    def parse(cls, name: str, world_size: int, microbatches: int = 4) -> Strategy:
        """The strategy called ``name`` on ``world_size`` ranks (see ``NAMES``).

        Args:
            name: a key of ``NAMES``.
            world_size: p, the ranks to use.
            microbatches: micro-batches per step for the pipeline strategies.

        Returns:
            The ``Strategy``.

        Raises:
            ValueError: an unknown name, or a 2-D name on a world size that is not an even
                number ≥ 4.
        """
        p = world_size
        if name not in NAMES:
            raise ValueError(f"unknown strategy {name!r}; pick one of {sorted(NAMES)} or 'auto'")
        if name in ("dp_tp", "dp_pp") and (p < 4 or p % 2):
            raise ValueError(f"{name} splits {p} ranks as 2 × {p}/2: needs an even p >= 4")
        return {
            "dp": lambda: cls(dp=p),
            "zero1": lambda: cls(dp=p, zero_stage=1),
            "zero2": lambda: cls(dp=p, zero_stage=2),
            "zero3": lambda: cls(dp=p, zero_stage=3),
            "fsdp": lambda: cls(dp=p, zero_stage=3, fsdp=True),
            "pp": lambda: cls(pp=p, microbatches=microbatches),
            "tp": lambda: cls(tp=p),
            "dp_tp": lambda: cls(dp=2, tp=p // 2),
            "dp_pp": lambda: cls(dp=2, pp=p // 2, microbatches=microbatches),
        }[name]()

    @classmethod
    def from_plan(cls, plan: Any) -> Strategy:
        """The strategy that runs a planner ``Plan`` (its dp, pp, tp, zero_stage, microbatches).

        ZeRO with a single data-parallel rank shards nothing, so it runs as stage 0.

        Args:
            plan: anything with those five attributes (``lk.planner.Plan``).

        Returns:
            The ``Strategy``.

        Raises:
            ValueError: a plan this runner cannot train (see the class).
        """
        zero = plan.zero_stage if plan.dp > 1 else 0
        return cls(
            dp=plan.dp, pp=plan.pp, tp=plan.tp, zero_stage=zero, microbatches=plan.microbatches
        )

    @classmethod
    def runs(cls, plan: Any) -> bool:
        """Whether ``from_plan(plan)`` would succeed."""
        try:
            cls.from_plan(plan)
        except ValueError:
            return False
        return True
