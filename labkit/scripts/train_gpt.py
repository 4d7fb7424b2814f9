"""TinyGPT on the character corpus under a strategy of the course, launched by torchrun.

Introduced in notebooks/21_capstone.ipynb (the capstone as a script); it runs the labs of
notebooks/11_pipeline_parallel.ipynb (``pp``), 12 (``tp``), 13 (``zero1``, ``zero2``,
``zero3``, ``fsdp``), 14 (``dp_tp``, ``fsdp_tp``, ``dp_pp``) and 17 (any of them, ``dp``
and ``dp_pp_tp``).

Every rank runs ``lk.capstone.train_rank`` with ``Strategy.parse(--strategy, WORLD_SIZE)``
inside the process group torchrun set up, so the model is composed by the same
``labkit.parallel.compose`` chain as in the notebooks (rank 0 prints it): the same TinyGPT
(seeded), the same global batch per step (``--batch-size`` sequences per data-parallel
replica, so ``batch-size · dp`` in all), Adam, and the capstone's recipe (``--microbatches``,
``--precision``, ``--max-norm``, ``--warmup-steps``, ``--decay``, ``--ckpt-dir`` with
``--ckpt-at`` or ``--resume``). Rank 0 prints the loss of every step and the throughput in
tokens per second (of the slowest rank), every rank prints the bytes of parameters,
gradients and optimizer states it holds, and all ranks print one checksum of the full final
parameters (gathered from the shards as the capstone gathers them; rank 0 shares them with
the others). Tensors live on the rank's device (``labkit.launcher.device_rule``: a GPU per
rank with NCCL when there are enough, else the CPU with gloo). A strategy the world size or
the model cannot take (``dp_tp`` on 2 ranks, ``tp`` on 3 with 4 heads) stops every rank
before the process group starts, with the arithmetic.

One node, 2 processes, tensor parallelism::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_gpt --strategy tp --steps 20

Two nodes, 2 processes each, 2 data-parallel replicas × a 2-stage pipeline: the same command
on both (``HOST`` is node 0's address, reachable from node 1; the c10d rendezvous assigns
the ranks, so no ``--node-rank``)::

    torchrun --nnodes 2 --nproc-per-node 2 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id gpt-dp-pp \\
        -m labkit.scripts.train_gpt --strategy dp_pp --steps 20

Ranks are laid out tensor-parallel innermost (``Strategy.dims``, a
``labkit.parallel.dims.ParallelDims``: ``rank = (dp_rank·pp + pp_rank)·tp + tp_rank``), so
with ``--nproc-per-node`` equal to the tensor-parallel degree the tensor-parallel peers
share a node. The same strategy and world size give the same checksum on one node
or on several.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

from labkit.capstone import NAMES, RunConfig, Strategy, build_model, train_rank
from labkit.data import char_corpus
from labkit.scripts import _common


def _parser() -> argparse.ArgumentParser:
    # Every lab script's options, with the capstone's optimizer (Adam) and batch in place of
    # the base parser's SGD and per-rank batch.
    p = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common.base_parser(__doc__)],
        conflict_handler="resolve",
    )
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate")
    p.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="sequences per data-parallel replica per step (global batch: this × dp)",
    )
    p.add_argument("--backend", default="auto", help='"auto": NCCL with a GPU per rank, else gloo')
    p.add_argument("--strategy", choices=sorted(NAMES), default="dp", help="see Strategy")
    p.add_argument(
        "--microbatches", type=int, default=None,
        help="micro-batches per step: a pipeline's (default 4), else accumulation (default 1)",
    )  # fmt: skip
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="autocast")
    p.add_argument("--max-norm", type=float, default=None, help="clip the global grad norm")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear warmup steps")
    p.add_argument("--decay", choices=("constant", "cosine"), default="constant", help="lr decay")
    p.add_argument("--ckpt-dir", default=None, help="DCP checkpoints go here")
    p.add_argument("--ckpt-at", type=int, default=None, help="checkpoint after this many steps")
    p.add_argument("--resume", action="store_true", help="start from the newest checkpoint")
    p.add_argument("--dim", type=int, default=64, help="model width")
    p.add_argument("--n-layers", type=int, default=4, help="transformer blocks")
    p.add_argument("--n-heads", type=int, default=4, help="attention heads")
    p.add_argument("--seq-len", type=int, default=32, help="characters per sequence")
    p.add_argument("--eval-every", type=int, default=5, help="validation loss every k steps")
    return p


def plan(args, world_size: int) -> tuple[Strategy, RunConfig]:
    """The strategy and run of the parsed options on ``world_size`` ranks.

    Args:
        args: ``train_gpt``'s parsed options.
        world_size: the job's ranks (torchrun's ``WORLD_SIZE``).

    Returns:
        ``(strategy, config)``; the global batch (and validation batch) is
        ``args.batch_size · strategy.dp``.

    Raises:
        ValueError: the strategy does not fit the world size, or cannot split the model.
    """
    strategy = Strategy.parse(args.strategy, world_size, microbatches=args.microbatches)
    batch = args.batch_size * strategy.dp
    config = RunConfig(
        dim=args.dim,
        n_layers=args.n_layers,
        n_heads=args.n_heads,
        seq_len=args.seq_len,
        batch=batch,
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        eval_every=args.eval_every,
        val_batch=batch,
        timeout_s=args.timeout,
        precision=args.precision,
        max_norm=args.max_norm,
        warmup_steps=args.warmup_steps,
        decay=args.decay,
        ckpt_dir=args.ckpt_dir,
        ckpt_at=args.ckpt_at,
        resume=args.resume,
    )
    config.check(strategy)
    return strategy, config


def main(argv: list[str] | None = None) -> int:
    """Train under ``--strategy``, print losses, throughput, bytes and the checksum; return 0.

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).

    Returns:
        The exit code (2, from argparse, for a strategy the job cannot run).
    """
    p = _parser()
    args = p.parse_args(argv)
    # Checked before the process group starts: every rank stops at once, nothing waits.
    try:
        strategy, config = plan(args, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError as e:
        p.error(f"--strategy {args.strategy} on WORLD_SIZE={os.environ.get('WORLD_SIZE')}: {e}")
    env = _common.init(args.backend, args.timeout)
    r = env.rank
    if r == 0:
        print(f"[rank 0] {strategy.name}: {strategy.label} on {env.world_size} ranks", flush=True)
    result = train_rank(r, env.world_size, strategy, config)
    if r == 0:
        print("[rank 0] composed as:", *result["chain"], sep="\n    ", flush=True)
    tokens = config.batch * config.seq_len
    if r == 0:
        first = result["first_step"]  # 0, or the step a resumed run starts after
        for k, (loss, s) in enumerate(zip(result["losses"], result["step_s"], strict=True)):
            print(f"[rank 0] step {first + k + 1} loss {loss:.4f} ({s * 1e3:.1f} ms)", flush=True)
        val = ", ".join(
            f"{k}: {v:.4f}" for k, v in zip(result["val_steps"], result["val_losses"], strict=True)
        )
        print(f"[rank 0] validation loss by step {{{val}}}", flush=True)
        print(
            f"[rank 0] {tokens * len(result['step_s']) / sum(result['step_s']):.0f} tokens/s "
            f"({tokens} tokens per step)",
            flush=True,
        )
    b = result["bytes"]
    print(
        f"[rank {r}] bytes params={b['params']} grads={b['grads']} "
        f"optimizer={b['optimizer']} total={sum(b.values())}",
        flush=True,
    )
    per_rank: list[dict | None] = [None] * env.world_size
    dist.all_gather_object(per_rank, b)

    # The full parameters, gathered on rank 0, into one unsplit model on every rank (on the
    # rank's device: under NCCL a broadcast carries device tensors only).
    model = build_model(config, char_corpus().vocab_size).to(env.device)
    params = dict(model.named_parameters())
    if r == 0:
        full = result["full_state"]
        if full.keys() != params.keys():
            raise RuntimeError(f"gathered names {sorted(full)} differ from {sorted(params)}")
        with torch.no_grad():
            for k, v in params.items():
                v.copy_(full[k])
    for v in params.values():
        dist.broadcast(v.data, src=0)
    extra = {
        "strategy": strategy.name,
        "label": strategy.label,
        "world_size": env.world_size,
        "steps": config.steps,
        "batch": config.batch,
        "losses": result["losses"],
        "val_steps": result["val_steps"],
        "val_losses": result["val_losses"],
        "step_s": result["step_s"],
        "bytes": per_rank,
    }
    del result
    _common.finish(env, model, args.out, extra)
    return 0


if __name__ == "__main__":
    _common.run(main)
