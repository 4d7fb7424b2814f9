"""All-reduce algorithms built only from point-to-point messages, with their messages counted.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

Five algorithms, each ``fn(tensor, op=dist.ReduceOp.SUM, group=None)`` reducing in place
like ``dist.all_reduce`` (SUM, PRODUCT, MIN, MAX, AVG), from Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 2005, §4:

- ``naive``: all send to rank 0, which reduces and sends back (p−1 sends on rank 0, else 1);
- ``tree``: binomial-tree reduce, then tree broadcast (2(p−1) sends in all, ≤ 2⌈log2 p⌉ a rank);
- ``ring``: ring reduce-scatter, then ring all-gather (2(p−1) sends a rank, ≈ n/p elements each);
- ``recursive_doubling``: exchange with rank XOR 2^k (log2 p sends a rank for power-of-two p);
- ``rabenseifner``: recursive-halving reduce-scatter, then recursive-doubling all-gather
  (2·log2 p sends a rank of 2(p−1)/p · n elements in all, for power-of-two p).

Every exchange step (a send and a receive at once) is one ``dist.batch_isend_irecv`` call
(``P2P.start``), which NCCL needs to avoid a cycle of lazily created peer communicators.

Every message goes through a ``P2P`` object, so ``with count_messages() as stats:`` records
what each rank sent and received; ``expected_messages`` and ``expected_bytes`` give the same
numbers from the definitions alone. Example (on every rank, e.g. inside ``lk.launch``)::

    with lk.collectives.count_messages() as stats:
        lk.collectives.allreduce_ring(t)
    assert stats.messages_sent == lk.collectives.expected_messages("ring", world_size, rank)
"""

from __future__ import annotations

from collections.abc import Callable

from labkit.collectives.counting import P2P, CommStats, Message, count_messages
from labkit.collectives.expected import (
    chunk_bounds,
    chunk_sizes,
    expected_bytes,
    expected_messages,
    halving_doubling_windows,
    largest_power_of_two,
    tree_children,
)
from labkit.collectives.ops import OPS, check_same_input, op_name
from labkit.collectives.rabenseifner import allreduce_rabenseifner
from labkit.collectives.recursive_doubling import allreduce_recursive_doubling
from labkit.collectives.ring import all_gather_ring, allreduce_ring, reduce_scatter_ring
from labkit.collectives.rooted import (
    allreduce_naive,
    allreduce_tree,
    broadcast_tree,
    reduce_tree,
)
from labkit.collectives.timing import time_allreduce

ALGORITHMS: dict[str, Callable[..., None]] = {
    "naive": allreduce_naive,
    "tree": allreduce_tree,
    "ring": allreduce_ring,
    "recursive_doubling": allreduce_recursive_doubling,
    "rabenseifner": allreduce_rabenseifner,
}

__all__ = [
    "ALGORITHMS",
    "OPS",
    "P2P",
    "CommStats",
    "Message",
    "all_gather_ring",
    "allreduce_naive",
    "allreduce_rabenseifner",
    "allreduce_recursive_doubling",
    "allreduce_ring",
    "allreduce_tree",
    "broadcast_tree",
    "check_same_input",
    "chunk_bounds",
    "chunk_sizes",
    "count_messages",
    "expected_bytes",
    "expected_messages",
    "halving_doubling_windows",
    "largest_power_of_two",
    "op_name",
    "reduce_scatter_ring",
    "reduce_tree",
    "time_allreduce",
    "tree_children",
]
