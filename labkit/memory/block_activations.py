"""What one transformer block keeps for backward, tensor by tensor (Korthikanti et al. 2022, §4).

Introduced in notebooks/15_sequence_parallel.ipynb.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", 2022,
§4.1 counts the bytes a GPT layer stores for backward with 16-bit activations and 1-byte
dropout masks: per layer sbh(34 + 5as/h) (s sequence, b micro-batch, h hidden, a heads);
§4.2 divides parts of it by the tensor-parallel degree t: sbh(10 + 24/t + 5as/(ht)) with tensor
parallelism, sbh(34/t + 5as/(ht)) with sequence parallelism as well
(``labkit.memory.activation_bytes_per_layer``).

:func:`block_activation_terms` lists the same tensors one by one, with the assumptions as
arguments, so that the sum is Korthikanti's number under his assumptions *and* the bytes a
``labkit.models.TransformerBlock`` really saves under its own, measured with
``torch.autograd.graph.saved_tensors_hooks`` (``labkit.profile.SavedTensors``):

============================  ======================  ==========================================
assumption                    Korthikanti §4.1        ``labkit.models.TransformerBlock``
============================  ======================  ==========================================
``bytes_per_element``         2 (fp16/bf16)           4 (fp32)
``dropout``                   yes, 1-byte masks       none
``attention``                 ``"softmax"``: the      ``"flash"``: ``scaled_dot_product_attention``
                              s×s probabilities       (CPU flash kernel) keeps its output and a
                              (and their dropout)     fp32 log-sum-exp per row, never s×s
``layernorm_stat_bytes``      0 (not counted)         4: mean and 1/σ per token (2 per norm)
``ffn_hidden``                4h                      as built (4h by default)
``regather``                  yes (§4.2.2)            ``SequenceParallel*(regather=...)``
============================  ======================  ==========================================

``recompute`` (§5, notebook 14) says what backward rebuilds instead of keeping: ``"selective"``
drops the attention core's tensors (the s×s softmax output and its dropout, or the flash
kernel's log-sum-exp), which backward recomputes from the q, k and v it keeps — sbh·34 under
Korthikanti's assumptions; ``"full"`` keeps only the block's input (``"ln1 input"``) — 2sbh.
Measured on ``TransformerBlock`` under ``labkit.parallel.compose.apply_ac(..., mode=...)``,
whose ``torch.utils.checkpoint`` saves the checkpointed region's inputs.

"flash" is what selective recomputation (§5) asks for: the 5as/h term is gone. With
``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` the same block keeps the probabilities
instead — ``attention="softmax"`` (q and k scaled by √scale are kept in place of q and k: the
same bytes). LayerNorm's statistics are fp32 for fp32 inputs; on the CPU a bf16 LayerNorm keeps
them in bf16 (2 bytes). Pure arithmetic: no torch.
"""

from __future__ import annotations

__all__ = [
    "ATTENTION_CORE_TERMS",
    "ATTENTION_KINDS",
    "RECOMPUTE_MODES",
    "block_activation_bytes",
    "block_activation_terms",
]

ATTENTION_KINDS = ("softmax", "flash")
RECOMPUTE_MODES = ("none", "selective", "full")
# What selective recomputation rebuilds in backward (Korthikanti et al. 2022, §5): the attention
# core softmax(QKᵀ)·V — its s×s probabilities and their dropout, or a fused kernel's lse.
ATTENTION_CORE_TERMS = (
    "softmax output",
    "softmax dropout mask",
    "softmax dropout output",
    "log-sum-exp",
)
MASK_BYTES = 1  # a dropout mask: torch's bool, Korthikanti's "1 byte"
LSE_BYTES = 4  # attention's log-sum-exp per query row, fp32 whatever the inputs


def block_activation_terms(
    seq_len: int,
    micro_batch: int,
    hidden: int,
    n_heads: int,
    *,
    tensor_parallel: int = 1,
    sequence_parallel: bool = False,
    ffn_hidden: int | None = None,
    bytes_per_element: int = 2,
    attention: str = "softmax",
    dropout: bool = True,
    layernorm_stat_bytes: int = 0,
    regather: bool = True,
    recompute: str = "none",
) -> dict[str, float]:
    """Bytes of each tensor one pre-norm transformer block keeps for backward, on one rank.

    Korthikanti et al. 2022, §4.1 (the list), §4.2 (what t-way tensor and sequence
    parallelism divide by t) and §5 (recomputation). With the defaults the sum is
    ``activation_bytes_per_layer`` (with the same ``recompute``).

    Args:
        seq_len: s.
        micro_batch: b.
        hidden: h.
        n_heads: a.
        tensor_parallel: t (1: none).
        sequence_parallel: the LayerNorm and dropout regions hold s/t tokens.
        ffn_hidden: the MLP's inner width (None: 4h).
        bytes_per_element: bytes of an activation (2: fp16/bf16, 4: fp32).
        attention: ``"softmax"`` keeps the s×s softmax output; ``"flash"`` keeps the output's
            fp32 log-sum-exp per row instead (its output is the projection's input, counted once).
        dropout: dropout after the softmax, the attention and the MLP (1-byte masks).
        layernorm_stat_bytes: bytes of each of LayerNorm's mean and 1/σ per token (4: fp32;
            0: not counted, as Korthikanti does).
        regather: with sequence parallelism, the GEMMs after an all-gather keep this rank's s/t
            tokens and gather again in backward (§4.2.2); False: they keep all s.
        recompute: ``"none"``; ``"selective"`` (the attention core's terms,
            ``ATTENTION_CORE_TERMS``, are recomputed in backward, not kept); ``"full"`` (only
            the block's input, ``"ln1 input"``, is kept).

    Returns:
        dict[str, float]: tensor name → bytes, in the block's order; sum it for the total.

    Raises:
        ValueError: non-positive sizes, negative ``layernorm_stat_bytes``, or an unknown
            ``attention`` or ``recompute``.
    """
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute must be one of {RECOMPUTE_MODES}, got {recompute!r}")
    if isinstance(layernorm_stat_bytes, bool) or layernorm_stat_bytes < 0:
        raise ValueError(f"layernorm_stat_bytes must be an int >= 0, got {layernorm_stat_bytes!r}")
    f = 4 * hidden if ffn_hidden is None else ffn_hidden
    for name, v in (
        ("seq_len", seq_len),
        ("micro_batch", micro_batch),
        ("hidden", hidden),
        ("n_heads", n_heads),
        ("tensor_parallel", tensor_parallel),
        ("ffn_hidden", f),
        ("bytes_per_element", bytes_per_element),
    ):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}")
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {attention!r}")
    s, b, h, a, t, e = seq_len, micro_batch, hidden, n_heads, tensor_parallel, bytes_per_element
    sbh = s * b * h
    t_sp = t if sequence_parallel else 1  # LayerNorm and dropout regions
    t_in = t if sequence_parallel and regather else 1  # the GEMM inputs after an all-gather

    def norm(i: int) -> dict[str, float]:
        out = {f"ln{i} input": e * sbh / t_sp}
        if layernorm_stat_bytes:
            out[f"ln{i} mean and 1/σ"] = 2 * layernorm_stat_bytes * s * b / t_sp
        return out

    terms = norm(1)
    terms["q, k, v input"] = e * sbh / t_in
    terms["q, k, v"] = 3 * e * sbh / t
    if attention == "softmax":
        terms["softmax output"] = e * a * s * s * b / t
        if dropout:
            terms["softmax dropout mask"] = MASK_BYTES * a * s * s * b / t
            terms["softmax dropout output"] = e * a * s * s * b / t
    else:
        terms["log-sum-exp"] = LSE_BYTES * a * s * b / t
    terms["projection input"] = e * sbh / t
    if dropout:
        terms["attention dropout mask"] = MASK_BYTES * sbh / t_sp
    terms |= norm(2)
    terms["fc1 input"] = e * sbh / t_in
    terms["activation input"] = e * s * b * f / t
    terms["fc2 input"] = e * s * b * f / t
    if dropout:
        terms["MLP dropout mask"] = MASK_BYTES * sbh / t_sp
    if recompute == "full":  # a checkpointed block keeps its input, rebuilds the rest
        return {"ln1 input": terms["ln1 input"]}
    if recompute == "selective":
        return {k: v for k, v in terms.items() if k not in ATTENTION_CORE_TERMS}
    return terms


def block_activation_bytes(*args: int, **kwargs: object) -> float:
    """The sum of :func:`block_activation_terms` (same arguments).

    Args:
        *args, **kwargs: as :func:`block_activation_terms`.

    Returns:
        float: bytes one block keeps for backward on one rank.

    Raises:
        ValueError: as :func:`block_activation_terms`.
    """
    return sum(block_activation_terms(*args, **kwargs).values())
