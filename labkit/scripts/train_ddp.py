"""Data-parallel training of an MLP on digits, launched by torchrun on one node or many.

Introduced in notebooks/06_data_parallel.ipynb (the data-parallel lab as a script).

Every rank builds the same ``lk.models.MLP`` (seeded), trains on its shard of
``lk.data.digits("train")`` (a seeded ``DistributedSampler``) with SGD, and gradients are
averaged by PyTorch's ``DistributedDataParallel`` (``--ddp torch``) or by labkit's
``DataParallelBucketed`` (``--ddp labkit``). It prints a checksum of the final parameters;
the same global world size gives the same bits on one node or on two.

One node, 2 processes::

    torchrun --standalone --nproc-per-node 2 -m labkit.scripts.train_ddp --steps 20

Two nodes, 1 process each: the same command on both (``HOST`` is node 0's address,
reachable from node 1; the c10d rendezvous assigns the ranks, so no ``--node-rank``)::

    torchrun --nnodes 2 --nproc-per-node 1 \\
        --rdzv-backend c10d --rdzv-endpoint HOST:29400 --rdzv-id ddp-digits \\
        -m labkit.scripts.train_ddp --steps 20

Both "nodes" on one machine over loopback (what tests/test_scripts_torchrun.py does; both
agents match 127.0.0.1, so ``is_host`` says which one hosts the rendezvous store)::

    GLOO_SOCKET_IFNAME=lo torchrun --nnodes 2 --nproc-per-node 1 \\
        --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --rdzv-id ddp-digits \\
        --rdzv-conf is_host=1 --local-addr 127.0.0.1 -m labkit.scripts.train_ddp --steps 20
    (and the same with ``--rdzv-conf is_host=0`` in a second shell)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler

from labkit import data, models
from labkit.scripts import _common


def main(argv: list[str] | None = None) -> int:
    """Train, print the final parameter checksum, save it to ``--out``; return 0.

    Introduced in notebooks/06_data_parallel.ipynb.

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).

    Returns:
        The exit code.
    """
    p = _common.base_parser(__doc__)
    p.add_argument("--ddp", choices=("torch", "labkit"), default="torch", help="DDP wrapper")
    args = p.parse_args(argv)
    env = _common.init(args.backend, args.timeout)
    model = models.MLP(seed=args.seed).to(env.device)
    if args.ddp == "torch":
        ddp: nn.Module = nn.parallel.DistributedDataParallel(model)
    else:
        from labkit.parallel.ddp import DataParallelBucketed

        ddp = DataParallelBucketed(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    ds = data.digits("train")
    sampler = DistributedSampler(ds, env.world_size, env.rank, shuffle=True, seed=args.seed)
    # The loader's own generator: iter(loader) then never draws from the global torch RNG.
    gen = torch.Generator().manual_seed(args.seed)
    loader = DataLoader(
        ds, batch_size=args.batch_size, sampler=sampler, drop_last=True, generator=gen
    )
    step, epoch = 0, 0
    while step < args.steps:
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(env.device), y.to(env.device)
            loss = nn.functional.cross_entropy(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if env.rank == 0 and (step % 10 == 0 or step == args.steps):
                print(f"[rank 0] step {step} loss {loss.item():.4f}", flush=True)
            if step == args.steps:
                break
        epoch += 1
    del ddp, opt
    _common.finish(env, model, args.out, {"world_size": env.world_size, "steps": step})
    return 0


if __name__ == "__main__":
    _common.run(main)
