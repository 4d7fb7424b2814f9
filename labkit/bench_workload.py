"""Time a model's own layers and its optimizer: the compute side of the step-time model.

Introduced in notebooks/21_capstone.ipynb.

A planner that prices compute with a matrix product's peak FLOP/s misses a small model by
an order of magnitude: its layers are short kernels with Python between them. Here every
layer of an ``nn.Sequential`` is timed on one thread (a rank's share of the cores), forward
and backward separately, at several token counts, and ``a + c·N`` is fitted to each: a
per-call part (the kernels' launch and Python, paid whatever the size) and a per-token part,
both rescaled so the layers add up to the whole model timed the same way (layers alike, such
as a transformer's blocks, share one fit). Adam's step is timed over the model's tensors and
over one flat tensor of as many elements (its cost per tensor and per element), and a whole
single-process step against the sum of its parts gives the rest of its Python. The result is
a ``labkit.plan_workload.Workload``::

    work = lk.bench.workload_from_model(model, x_of, y_of, loss_fn, batch=16, seq_len=32,
                                        blocks=range(1, 5), tp_plan=plan)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

import torch
from torch import nn

from labkit.bench_framework import framework_costs
from labkit.costmodel.network import least_squares_alpha_beta
from labkit.plan_workload import LayerCost, Workload

__all__ = ["capstone_workload", "time_layers", "workload_from_model"]

Batch = Callable[[int], torch.Tensor]


def _best_time(fn: Callable[[], object], reps: int) -> float:
    """The fastest of ``reps`` runs after a warm-up: the work itself, without the time slices
    other processes take (the machine model's compute sharing adds those back)."""
    fn()  # warm-up: allocator, first-call paths
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _units(layer: nn.Module) -> tuple[tuple[int, ...], ...]:
    """Per module with trainable parameters of its own: their element counts (ZeRO's units)."""
    out = []
    for mod in layer.modules():
        own = [p.numel() for p in mod.parameters(recurse=False) if p.requires_grad]
        if own:
            out.append(tuple(own))
    return tuple(out)


def _fit(tokens: list[int], times: list[float]) -> tuple[float, float]:
    times = [max(t, 1e-7) for t in times]  # a backward shorter than noise: 0.1 us, not zero
    if len(set(tokens)) < 2:
        return 0.0, sum(times) / sum(tokens)
    a, c = least_squares_alpha_beta(tokens, times, relative=True)
    if a < 0:  # a line through the origin: no per-call part
        a, c = 0.0, sum(times) / sum(tokens)
    return a, max(c, 0.0)


def time_layers(
    model: nn.Sequential,
    x_of: Batch,
    y_of: Batch,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    sizes: Iterable[int],
    reps: int = 5,
) -> list[tuple[list[int], list[float], list[float]]]:
    """Forward and backward times of every layer at several batch sizes, on one thread.

    Each layer runs on the output of the layers before it (detached, so its backward stops
    at its input); the last layer's time includes ``loss_fn``.

    Args:
        model: the layers in order.
        x_of: batch size → an input batch; ``y_of``: batch size → its targets.
        loss_fn: the loss of the last layer's output.
        sizes: batch sizes (sequences) to time.
        reps: timed repetitions (the fastest counts).

    Returns:
        Per layer ``(tokens, forward seconds, backward seconds, output width)``, the lists
        with one entry per size.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    layers = list(model)
    out = [([], [], [], 0) for _ in layers]
    cases = []  # (layer index, tokens, forward, forward + backward)
    try:
        for b in sizes:
            x, y = x_of(b), y_of(b)
            h = x
            for i, layer in enumerate(layers):
                inp = h.detach().requires_grad_(h.is_floating_point())
                last = i == len(layers) - 1

                def forward(layer=layer, inp=inp, last=last, y=y):
                    o = layer(inp)
                    return loss_fn(o, y) if last else o

                def both(forward=forward):
                    o = forward()
                    o.backward(torch.ones_like(o) if o.dim() else None)

                with torch.no_grad():
                    h = layer(inp)
                out[i] = (*out[i][:3], int(h.shape[-1]))
                cases.append((i, int(y.numel()), forward, both))
        # every case once per round, rounds interleaved: a slow moment of the machine hits
        # one repetition of many cases instead of every repetition of one
        best = [[math.inf, math.inf] for _ in cases]
        for _ in range(reps + 1):
            for k, (i, _, forward, both) in enumerate(cases):
                for j, fn in enumerate((forward, both)):
                    t0 = time.perf_counter()
                    fn()
                    best[k][j] = min(best[k][j], time.perf_counter() - t0)
                layers[i].zero_grad(set_to_none=True)
    finally:
        torch.set_num_threads(threads)
    for (i, tokens, _, _), (f, fb) in zip(cases, best, strict=True):
        out[i][0].append(tokens)
        out[i][1].append(f)
        out[i][2].append(max(fb - f, 0.0))
    return out


def _scaled_to_whole(fits: dict, whole: list) -> dict:
    """Layer fits rescaled so that they add up to the whole model's: a layer timed alone
    misses what running them one after the other costs (cold caches, one autograd graph).
    The per-call parts and the per-token parts are scaled separately, forward and backward."""
    ((tokens, f, b, _),) = whole
    out = dict(fits)
    for d, times in ((0, f), (1, b)):
        a_all, c_all = _fit(tokens, times)
        a_sum = sum(v[d][0] for v in fits.values())
        c_sum = sum(v[d][1] for v in fits.values())
        for i, v in fits.items():
            a, c = v[d]
            a = a * a_all / a_sum if a_sum else a_all / len(fits)
            c = c * c_all / c_sum if c_sum else c_all / len(fits)
            out[i] = (out[i][0], (a, c)) if d else ((a, c), out[i][1])
    return out


def _adam_costs(model: nn.Module, reps: int) -> tuple[float, float]:
    """Adam's seconds per tensor and per element: its step over the model's tensors and over
    one flat tensor of as many elements."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        params = [p.detach().clone().requires_grad_() for p in model.parameters()]
        flat = [torch.zeros(sum(p.numel() for p in params), requires_grad=True)]
        times = []
        for ps in (params, flat):
            for p in ps:
                p.grad = torch.ones_like(p)
            opt = torch.optim.Adam(ps, lr=1e-3)
            times.append(_best_time(opt.step, reps))
    finally:
        torch.set_num_threads(threads)
    k, psi = len(params), flat[0].numel()
    per_tensor = max(0.0, (times[0] - times[1]) / max(1, k - 1))
    return per_tensor, max(0.0, times[1] - per_tensor) / psi


def workload_from_model(
    model: nn.Sequential,
    x_of: Batch,
    y_of: Batch,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    batch: int,
    seq_len: int,
    blocks: Iterable[int],
    tp_plan: dict[str, str] | None = None,
    sizes: Iterable[int] | None = None,
    reps: int = 5,
    step: Callable[[], object] | None = None,
    name: str = "model",
) -> Workload:
    """Calibrate a ``Workload`` of ``model`` on this machine (one thread).

    Args:
        model: the model, an ``nn.Sequential`` of layers.
        x_of, y_of: batch size → an input batch and its targets.
        loss_fn: the loss of the model's output.
        batch: B, sequences per optimizer step; seq_len: T, tokens per sequence.
        blocks: indices of the repeated blocks (what a pipeline splits).
        tp_plan: Megatron's plan, ``{"1.attn.q": "colwise", ...}`` (names in ``model``).
        sizes: batch sizes to time (default: 1 and ``batch``).
        reps: timed repetitions of each measurement.
        step: one whole single-process training step of ``batch`` sequences, timed to find
            the Python beyond the layers and Adam (None: no such overhead).
        name: a label.

    Returns:
        The ``Workload``.
    """
    plan, block_set = tp_plan or {}, set(blocks)
    sizes = sorted(set(sizes or (1, batch)))
    timed = time_layers(model, x_of, y_of, loss_fn, sizes, reps)
    # Layers alike (same class, same parameter count: TinyGPT's blocks) share one fit of
    # all their samples: their costs are the same, and the fit is steadier.
    kinds: dict[tuple, list[int]] = {}
    for i, layer in enumerate(model):
        kind = (type(layer).__name__, sum(p.numel() for p in layer.parameters()))
        kinds.setdefault(kind, []).append(i)
    fits = {}
    for members in kinds.values():
        tok = [t for i in members for t in timed[i][0]]
        fwd = _fit(tok, [t for i in members for t in timed[i][1]])
        bwd = _fit(tok, [t for i in members for t in timed[i][2]])
        fits |= dict.fromkeys(members, (fwd, bwd))
    fits = _scaled_to_whole(
        fits, time_layers(nn.Sequential(model), x_of, y_of, loss_fn, sizes, reps)
    )
    modules = dict(model.named_modules())
    layers = []
    for i, (layer, (_, _, _, width)) in enumerate(zip(model, timed, strict=True)):
        mine = {k: v for k, v in plan.items() if k.split(".")[0] == str(i)}
        split = sum(
            modules[k].weight.numel() + (modules[k].bias.numel() if v == "colwise" else 0)
            for k, v in mine.items()
        )
        layers.append(
            LayerCost(
                name=type(layer).__name__,
                units=_units(layer),
                forward=fits[i][0],
                backward=fits[i][1],
                block=i in block_set,
                tp_colwise=sum(v == "colwise" for v in mine.values()),
                tp_rowwise=sum(v == "rowwise" for v in mine.values()),
                tp_split=split,
                width=width,
            )
        )
    adam = _adam_costs(model, reps)
    work = Workload(tuple(layers), batch, seq_len, adam=adam, name=name)
    if step is None:
        return work
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        measured = _best_time(step, reps)
    finally:
        torch.set_num_threads(threads)
    tokens = batch * seq_len
    parts = sum(sum(layer.time_s(tokens)) for layer in layers)
    parts += adam[0] * work.tensors(list(range(len(layers)))) + adam[1] * work.numel
    return Workload(tuple(layers), batch, seq_len, adam=adam, name=name,
                    step_overhead_s=max(0.0, measured - parts))  # fmt: skip


def capstone_workload(config, reps: int = 5, strategies: Iterable = ()) -> Workload:
    """The ``Workload`` of notebook 21's TinyGPT run (``lk.capstone.RunConfig``), calibrated.

    Times TinyGPT's embedding, blocks and head (with the loss) at one sequence and at the
    whole batch, Adam, and one whole step of the capstone's recipe on one process (forward,
    backward, clipping, Adam, the schedule); then each of ``strategies``' own code, on one
    process with every collective removed (``labkit.bench_framework.framework_costs``).

    Args:
        config: the run's sizes and recipe.
        reps: timed repetitions of each measurement.
        strategies: ``lk.capstone.Strategy`` objects to time (none: no ``framework``).

    Returns:
        The ``Workload``.
    """
    from labkit.capstone import build_model, global_batch, gpt_tp_plan, lm_loss, make_schedule
    from labkit.data import char_corpus

    corpus = char_corpus()
    model = build_model(config, corpus.vocab_size)
    x, y = global_batch(corpus, config, 0)
    opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    schedule = make_schedule(opt, config)

    def step() -> None:
        opt.zero_grad()
        lm_loss(model(x), y).backward()
        if config.max_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_norm)
        opt.step()
        schedule.step()

    work = workload_from_model(
        model,
        lambda b: x[:b],
        lambda b: y[:b],
        lm_loss,
        batch=config.batch,
        seq_len=config.seq_len,
        blocks=range(1, model.n_layers + 1),
        tp_plan=gpt_tp_plan(model),
        sizes=(1, config.batch),
        reps=reps,
        step=step,
        name="TinyGPT",
    )
    strategies = list(strategies)
    return framework_costs(work, config, strategies, reps) if strategies else work
