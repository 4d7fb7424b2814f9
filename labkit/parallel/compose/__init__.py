"""Composing the techniques: one ``apply_*`` per parallelism, applied in one documented order.

Introduced in notebooks/18_hybrid_parallel.ipynb; notebooks/21_capstone.ipynb and
``labkit.scripts.train_gpt`` build every strategy with it.

Each technique of the course is one verb that takes the module and the mesh or group it acts
on, in the manner of torchtitan's ``parallelize_llama``
(``torchtitan/models/llama3/infra/parallelize.py``) and ``pipeline_llama``:

- ``apply_pp(model, pp_group, ...)``: cut the model into stages, keep this rank's (notebook 11);
- ``apply_tp(module, plan, tp, style)``: Megatron's column/row-parallel layers from scratch
  (notebook 12) or DTensor's ``parallelize_module`` (needed under FSDP2);
- ``apply_sp(module, tp, style)``: tensor *and* sequence parallelism of the transformer blocks
  on the same tp axis (Korthikanti et al. 2022; notebook 15), in place of
  ``apply_tp`` when ``parallelize(..., sp=True)``;
- ``apply_ac(module, names, mode)``: activation checkpointing of the named blocks, whole
  (``"full"``) or their attention core only (``"selective"``, notebook 14);
- ``apply_ddp(module, dp_group)`` (notebook 07), ``apply_zero(module, stage, dp_group)`` or
  ``apply_fsdp(module, dp_mesh)`` (notebook 13): the data-parallel flavour.

``parallelize(model, dims, mesh, ...)`` gates each on ``dims.*_enabled`` and applies them in
this order, torchtitan's:

1. **pp** first: every later transform then touches only the layers this rank keeps, and
   each stage is tensor- and data-parallelized like a whole model;
2. **tp** (or **sp**) next: it replaces layers and parameters by their shards (new modules, or
   DTensors on the tp mesh), and whatever comes later must see the final parameters — FSDP2
   shards a tp DTensor again over dp (a 2-D DTensor), DDP's buckets and ZeRO's shards are laid
   out over the tp-local tensors;
3. **ac** then: it wraps whole blocks whose layers tp has already replaced, so the
   recomputation in backward runs the tensor-parallel layers; it must come before data
   parallelism so that FSDP's hooks stay outside the checkpointed forward and the
   recomputation finds the parameters gathered (torchtitan applies ``torch.compile`` here too);
4. **dp** last: the outermost wrapper; it broadcasts, buckets or shards the parameters as
   they finally are and hooks their gradients.

What each rank then updates is listed once, as ``Piece`` objects (a parameter, its name in the
unsplit model, the axes it is split along): the gradient clipping (``clip_grad_norm_``) and
the DCP checkpoint (``checkpoint_state``) both read it. ``forward_backward`` runs one
optimizer step's micro-batches with one gradient reduction (``no_sync`` for the others).
"""

from __future__ import annotations

from labkit.parallel.compose.ac import AC_MODES, apply_ac
from labkit.parallel.compose.clip import clip_grad_norm_
from labkit.parallel.compose.dp import apply_ddp, apply_fsdp, apply_zero
from labkit.parallel.compose.gather import full_parameters, full_tensor, rank_state_bytes
from labkit.parallel.compose.parallelize import DP_FLAVOURS, Parallelized, parallelize
from labkit.parallel.compose.pieces import Piece, copies
from labkit.parallel.compose.pp import PipelineStage, apply_pp
from labkit.parallel.compose.sp import apply_sp, reduce_sp_gradients
from labkit.parallel.compose.state import checkpoint_state, init_optimizer_state, load_state
from labkit.parallel.compose.step import forward_backward, train_sgd
from labkit.parallel.compose.sync import no_sync, reduce_gradients
from labkit.parallel.compose.tp import TP_STYLES, apply_tp, tp_split

__all__ = [
    "AC_MODES",
    "DP_FLAVOURS",
    "TP_STYLES",
    "Parallelized",
    "Piece",
    "PipelineStage",
    "apply_ac",
    "apply_ddp",
    "apply_fsdp",
    "apply_pp",
    "apply_sp",
    "apply_tp",
    "apply_zero",
    "checkpoint_state",
    "clip_grad_norm_",
    "copies",
    "forward_backward",
    "full_parameters",
    "full_tensor",
    "init_optimizer_state",
    "load_state",
    "no_sync",
    "parallelize",
    "rank_state_bytes",
    "reduce_gradients",
    "reduce_sp_gradients",
    "tp_split",
    "train_sgd",
]
