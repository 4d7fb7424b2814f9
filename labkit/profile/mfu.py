"""Model FLOPs utilisation: the FLOPs a step needs, over its time and the device's peak rate.

Introduced in notebooks/20_performance_tuning.ipynb.

MFU (Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", Appendix B) is
``model FLOPs per step / (step time × peak FLOP/s)``: the share of the hardware's rate that went
into the model's own arithmetic. Communication, waiting, Python and recomputation all lower it.
The model FLOPs come from counting (``count_flops``: ``torch.utils.flop_counter.FlopCounterMode``
counts every matrix product and convolution of a call, backward included) or from the dense
estimate of Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", §2.1): ``6 N`` per
token for ``N`` parameters — 2N forward, 4N backward. The peak is measured
(``lk.bench.peak_flops``) or read off a data sheet::

    flops = lk.profile.count_flops(lambda: loss_fn(model(x), y).backward())
    lk.profile.mfu(flops, step_s, lk.bench.peak_flops().flops_per_s)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["count_flops", "dense_training_flops", "mfu"]


def count_flops(step: Callable[[], Any]) -> int:
    """FLOPs of one call of ``step``, as ``torch.utils.flop_counter.FlopCounterMode`` counts them.

    The counter has a formula per op for matrix products (``mm``, ``addmm``, ``bmm``, 2·m·n·k
    for an (m×k)·(k×n) product), convolutions and attention; element-wise ops, reductions
    and collectives count 0. Run forward and backward inside ``step`` to count a training step.

    Args:
        step: a function of no arguments (e.g. ``lambda: model(x).sum().backward()``).

    Returns:
        int: the total FLOPs counted.
    """
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def dense_training_flops(n_params: float, tokens: float) -> float:
    """Kaplan et al. 2020's training FLOPs: ``6 · n_params · tokens`` (2N forward, 4N backward).

    Args:
        n_params: parameters N taking part in matrix products (≥ 0).
        tokens: samples or tokens processed (≥ 0).

    Returns:
        float: FLOPs of forward plus backward.

    Raises:
        ValueError: a negative argument.
    """
    if n_params < 0 or tokens < 0:
        raise ValueError(f"need n_params >= 0 and tokens >= 0, got {n_params}, {tokens}")
    return 6.0 * n_params * tokens


def mfu(flops_per_step: float, step_s: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: ``flops_per_step / step_s / peak_flops`` (PaLM, Appendix B).

    Args:
        flops_per_step: the model's FLOPs in one step (on one rank, or summed over ranks with
            ``peak_flops`` summed alike).
        step_s: the step's measured time, seconds (> 0).
        peak_flops: the peak rate, FLOP/s (> 0): a data sheet's, or ``lk.bench.peak_flops``.

    Returns:
        float: the fraction of the peak achieved (1.0 = every cycle did model arithmetic).

    Raises:
        ValueError: ``step_s`` or ``peak_flops`` not positive, or negative FLOPs.
    """
    if step_s <= 0 or peak_flops <= 0 or flops_per_step < 0:
        raise ValueError(
            f"need step_s > 0, peak_flops > 0 and flops_per_step >= 0, got {step_s}, "
            f"{peak_flops}, {flops_per_step}"
        )
    return flops_per_step / step_s / peak_flops
