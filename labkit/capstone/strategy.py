"""A training strategy as data: the parallel degrees and the sharding, validated with arithmetic.

Introduced in notebooks/21_capstone.ipynb.

No torch: a ``Strategy`` is checked, named and compared with the planner's plans without
starting a process. Its ranks are laid out by ``labkit.parallel.dims.ParallelDims``
(``Strategy.dims``), the grid ``labkit.mesh`` and the planner use too.
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
    "fsdp_tp": "FSDP2 over 2 ranks × DTensor tensor parallelism over p/2 (a 2-D DeviceMesh)",
    "dp_pp": "2 data-parallel replicas × a pipeline of p/2 stages",
    "dp_pp_tp": "p/4 data-parallel replicas × a pipeline of 2 stages × tensor parallelism over 2",
}


@dataclass(frozen=True)
class Strategy:
    """How a model is trained on ``dp · pp · tp`` ranks.

    Ranks are laid out by ``self.dims`` (``labkit.parallel.dims.ParallelDims``), tensor
    parallelism innermost: global rank ``r = (dp_rank · pp + pp_rank) · tp + tp_rank``, so
    tensor-parallel peers are neighbours. ``labkit.capstone.gpt.parallelize_gpt`` turns it
    into the chain of ``labkit.parallel.compose`` calls.

    Args:
        dp: data-parallel degree.
        pp: pipeline stages.
        tp: tensor-parallel degree.
        zero_stage: 0 (replicated model states) or ZeRO stage 1, 2, 3 over the dp ranks.
        fsdp: ZeRO-3 done by PyTorch's ``fully_shard`` instead of labkit's ``ZeroStage3``
            (needs ``zero_stage=3``); with tp > 1 the tensor parallelism is DTensor's.
        microbatches: micro-batches per optimizer step, m: the pipeline's (pp > 1), or
            gradient accumulation with one data-parallel reduction per step (pp = 1).
        ac: activation checkpointing of every transformer block.

    Raises:
        ValueError: a degree below 1, an unknown ZeRO stage, ``fsdp`` without stage 3, or a
            combination the composition layer does not train (labkit's ZeRO with pp or tp,
            FSDP2 with pp).
    """

    dp: int = 1
    pp: int = 1
    tp: int = 1
    zero_stage: int = 0
    fsdp: bool = False
    microbatches: int = 1
    ac: bool = False

    def __post_init__(self) -> None:
        m = self.microbatches
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"microbatches must be an int >= 1, got {m!r}")
        ParallelDims(self.dp, self.pp, self.tp)  # raises naming a bad dp, pp or tp
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.fsdp and self.zero_stage != 3:
            raise ValueError(f"fsdp is ZeRO-3: zero_stage must be 3, got {self.zero_stage}")
        if self.zero_stage and not self.fsdp and (self.pp > 1 or self.tp > 1):
            raise ValueError(
                f"ZeRO-{self.zero_stage} with pp({self.pp}) and tp({self.tp}): labkit's ZeRO "
                "shards model states only under pure data parallelism (pp = tp = 1); "
                "FSDP2 composes with tp"
            )
        if self.fsdp and self.pp > 1:
            raise ValueError(
                f"FSDP2 with pp({self.pp}): the pipeline runtime holds back only DDP's "
                "reduction; use dp with pp"
            )

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
        """The short name, e.g. ``"zero2"``, ``"dp_tp"``, ``"fsdp_tp"`` or ``"dp"``."""
        if self.fsdp:
            return "fsdp_tp" if self.tp > 1 else "fsdp"
        if self.zero_stage:
            return f"zero{self.zero_stage}"
        parts = [k for k, v in (("dp", self.dp), ("pp", self.pp), ("tp", self.tp)) if v > 1]
        return "_".join(parts) or "dp"

    @property
    def label(self) -> str:
        """The planner's label, e.g. ``"dp2·pp1·tp2·zero0·m1"``."""
        return f"{self.dims.label}·zero{self.zero_stage}·m{self.microbatches}"

    @property
    def key(self) -> str:
        """``label``, told apart where the planner's is not: ``"…·zero3·m1·fsdp"``, ``"…·ac"``."""
        return self.label + ("·fsdp" if self.fsdp else "") + ("·ac" if self.ac else "")

    def coords(self, rank: int) -> tuple[int, int, int]:
        """``(dp_rank, pp_rank, tp_rank)`` of global rank ``rank`` (``ParallelDims``).

        Raises:
            ValueError: ``rank`` outside 0..world_size − 1.
        """
        c = self.dims.coordinates(rank)
        return c["dp"], c["pp"], c["tp"]

    @classmethod
    def parse(cls, name: str, world_size: int, microbatches: int | None = None) -> Strategy:
        """The strategy called ``name`` on ``world_size`` ranks (see ``NAMES``).

        Args:
            name: a key of ``NAMES``.
            world_size: p, the ranks to use.
            microbatches: micro-batches per step (None: 4 for a pipeline, else 1): a
                pipeline's, or gradient accumulation's without one.

        Returns:
            The ``Strategy``.

        Raises:
            ValueError: an unknown name, a 2-D name on a world size that is not an even
                number ≥ 4, or ``dp_pp_tp`` on a world size that is not a multiple of 4 ≥ 8.
        """
        p = world_size
        if name not in NAMES:
            raise ValueError(f"unknown strategy {name!r}; pick one of {sorted(NAMES)} or 'auto'")
        if name in ("dp_tp", "fsdp_tp", "dp_pp") and (p < 4 or p % 2):
            raise ValueError(f"{name} splits {p} ranks as 2 × {p}/2: needs an even p >= 4")
        if name == "dp_pp_tp" and (p < 8 or p % 4):
            raise ValueError(f"{name} splits {p} ranks as {p}/4 × 2 × 2: needs p = 8, 12, 16, ...")
        piped = name in ("pp", "dp_pp", "dp_pp_tp")
        m = microbatches if microbatches is not None else (4 if piped else 1)
        return {
            "dp": lambda: cls(dp=p, microbatches=m),
            "zero1": lambda: cls(dp=p, zero_stage=1, microbatches=m),
            "zero2": lambda: cls(dp=p, zero_stage=2, microbatches=m),
            "zero3": lambda: cls(dp=p, zero_stage=3, microbatches=m),
            "fsdp": lambda: cls(dp=p, zero_stage=3, fsdp=True, microbatches=m),
            "pp": lambda: cls(pp=p, microbatches=m),
            "tp": lambda: cls(tp=p, microbatches=m),
            "dp_tp": lambda: cls(dp=2, tp=p // 2, microbatches=m),
            "fsdp_tp": lambda: cls(dp=2, tp=p // 2, zero_stage=3, fsdp=True, microbatches=m),
            "dp_pp": lambda: cls(dp=2, pp=p // 2, microbatches=m),
            "dp_pp_tp": lambda: cls(dp=p // 4, pp=2, tp=2, microbatches=m),
        }[name]()

    @classmethod
    def from_plan(cls, plan: Any) -> Strategy:
        """The strategy that runs a planner ``Plan`` (its dp, pp, tp, zero_stage, microbatches).

        ZeRO with a single data-parallel rank shards nothing, so it runs as stage 0; ZeRO-3
        with tensor parallelism runs as FSDP2 × DTensor TP.

        Args:
            plan: anything with those five attributes (``lk.planner.Plan``).

        Returns:
            The ``Strategy``.

        Raises:
            ValueError: a plan this runner cannot train (see the class).
        """
        zero = plan.zero_stage if plan.dp > 1 else 0
        fsdp = zero == 3 and plan.tp > 1
        return cls(
            dp=plan.dp,
            pp=plan.pp,
            tp=plan.tp,
            zero_stage=zero,
            fsdp=fsdp,
            microbatches=plan.microbatches,
        )

    @classmethod
    def runs(cls, plan: Any) -> bool:
        """Whether ``from_plan(plan)`` would succeed."""
        try:
            cls.from_plan(plan)
        except ValueError:
            return False
        return True
