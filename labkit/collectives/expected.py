"""How many messages and bytes each all-reduce algorithm sends: pure arithmetic, no processes.

Introduced in notebooks/03_allreduce_algorithms.ipynb.

The counts follow from the algorithms' definitions in Thakur, Rabenseifner and Gropp,
"Optimization of Collective Communication Operations in MPICH", IJHPCA 19(1), 2005 (§4,
all-reduce; §3 for the tree broadcast and the ring / recursive-doubling building blocks),
for a tensor of ``numel`` elements on ``p = world_size`` ranks:

- naive: every rank sends its tensor to rank 0, which reduces and sends the result back:
  rank 0 sends and receives p−1 messages, every other rank 1 each, all of n elements.
- tree: binomial-tree reduce to rank 0, then binomial-tree broadcast: 2(p−1) messages of n
  elements in total, at most 2⌈log2 p⌉ per rank.
- ring: reduce-scatter then all-gather, p−1 steps each: 2(p−1) sends per rank of one chunk
  (about n/p elements) each, so about 2(p−1)/p · n elements per rank.
- recursive doubling: log2 p exchanges of n elements per rank when p is a power of two;
  otherwise the p − p' extra ranks (p' the largest power of two ≤ p) first fold into a
  partner and get the result back at the end (MPICH's scheme, same paper, §4).
- Rabenseifner: reduce-scatter by recursive halving, all-gather by recursive doubling
  (same paper, §4): 2·log2 p messages per rank for power-of-two p, carrying every chunk but
  the rank's own out (halving) and its growing block of finished chunks (doubling), so
  2(p−1)/p · n elements when p divides n; other p fold first, as recursive doubling does.

The tensor is split into chunks like ``torch.tensor_split``: the first ``numel % p`` chunks
hold one element more, and chunks may be empty (``numel < p``); empty messages still count.
"""

from __future__ import annotations

__all__ = [
    "chunk_bounds",
    "chunk_sizes",
    "expected_bytes",
    "expected_messages",
    "halving_doubling_windows",
    "largest_power_of_two",
    "tree_children",
]

_ALGORITHMS = ("naive", "tree", "ring", "recursive_doubling", "rabenseifner")


def chunk_sizes(numel: int, world_size: int) -> list[int]:
    """Sizes of the ``world_size`` chunks of a tensor of ``numel`` elements (ring algorithm).

    Args:
        numel: number of elements (may be 0 or smaller than ``world_size``).
        world_size: number of chunks.

    Returns:
        ``world_size`` sizes summing to ``numel``; the first ``numel % world_size`` are one
        larger than the rest, as in ``torch.tensor_split``.

    Raises:
        ValueError: ``numel < 0`` or ``world_size < 1``.
    """
    if numel < 0 or world_size < 1:
        raise ValueError(f"need numel >= 0 and world_size >= 1, got {numel} and {world_size}")
    base, extra = divmod(numel, world_size)
    return [base + (1 if i < extra else 0) for i in range(world_size)]


def chunk_bounds(numel: int, world_size: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each chunk from ``chunk_sizes``: chunk i is ``flat[start:stop]``.

    Args:
        numel: number of elements.
        world_size: number of chunks.

    Returns:
        One ``(start, stop)`` pair per chunk, in order, covering ``range(numel)``.

    Raises:
        ValueError: as ``chunk_sizes``.
    """
    bounds, start = [], 0
    for size in chunk_sizes(numel, world_size):
        bounds.append((start, start + size))
        start += size
    return bounds


def tree_children(rank: int, world_size: int) -> list[int]:
    """The children of ``rank`` in the binomial tree rooted at rank 0, in the order served.

    Rank r's children are r + 2^k for every 2^k below r's lowest set bit (every 2^k for
    rank 0) with r + 2^k < p. Thakur, Rabenseifner and Gropp 2005, §3 (binomial broadcast).

    Args:
        rank: a rank relative to the root (0 is the root).
        world_size: number of ranks in the tree.

    Returns:
        The children, nearest first (the order a reduce receives from them).

    Raises:
        ValueError: ``rank`` is not in ``range(world_size)``.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range({world_size})")
    out, mask = [], 1
    while mask < world_size and not rank & mask:
        if rank + mask < world_size:
            out.append(rank + mask)
        mask <<= 1
    return out


def largest_power_of_two(n: int) -> int:
    """p' = 2^⌊log2 n⌋, the largest power of two ≤ ``n``.

    Args:
        n: a positive int.

    Returns:
        The power of two.

    Raises:
        ValueError: ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    return 1 << (n.bit_length() - 1)


def halving_doubling_windows(
    new_rank: int, world_size: int
) -> list[tuple[str, int, tuple[int, int], tuple[int, int]]]:
    """The chunks each step of Rabenseifner's algorithm sends and receives, on p = 2^k ranks.

    Args:
        new_rank: the rank among the ``world_size`` ranks taking part.
        world_size: a power of two.

    Returns:
        One ``(phase, partner, sent, received)`` per step, ``sent`` and ``received`` as
        ``(first, stop)`` ranges of chunk indices: log2 p reduce-scatter steps (halving),
        then log2 p all-gather steps (doubling).

    Raises:
        ValueError: ``world_size`` is not a power of two, or ``new_rank`` out of range.
    """
    p, q = world_size, new_rank
    if p < 1 or p & (p - 1) or not 0 <= q < p:
        raise ValueError(f"need a power-of-two world size and a rank in it, got {q} of {p}")
    steps = []
    lo, hi, d = 0, p, p // 2
    while d >= 1:  # halving: the window of chunks still being reduced halves every step
        mid = lo + d
        keep, give = ((mid, hi), (lo, mid)) if q & d else ((lo, mid), (mid, hi))
        steps.append(("reduce-scatter", q ^ d, give, keep))
        lo, hi, d = keep[0], keep[1], d // 2
    d = 1
    while d < p:  # doubling: swap the aligned block of d finished chunks with the partner's
        mine = (q // d) * d
        theirs = mine ^ d
        steps.append(("all-gather", q ^ d, (mine, mine + d), (theirs, theirs + d)))
        d *= 2
    return steps


def _per_rank(algorithm: str, world_size: int, numel: int, rank: int) -> tuple[list, list]:
    """Element counts of the messages ``rank`` sends and receives under ``algorithm``."""
    p, n = world_size, numel
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(_ALGORITHMS)}")
    if p == 1:
        return [], []
    if algorithm == "naive":
        k = p - 1 if rank == 0 else 1
        return [n] * k, [n] * k
    if algorithm == "tree":
        k = len(tree_children(rank, p)) + (rank != 0)  # children, plus the parent
        return [n] * k, [n] * k
    if algorithm == "ring":
        c = chunk_sizes(n, p)
        # reduce-scatter sends every chunk but r's own and receives every chunk but r−1;
        # all-gather sends every chunk but r+1 and receives every chunk but r.
        sent = [c[(rank - s - 1) % p] for s in range(p - 1)] + [
            c[(rank - s) % p] for s in range(p - 1)
        ]
        received = [c[(rank - s - 2) % p] for s in range(p - 1)] + [
            c[(rank - s - 1) % p] for s in range(p - 1)
        ]
        return sent, received
    if algorithm == "recursive_doubling":
        p2 = largest_power_of_two(p)
        steps = p2.bit_length() - 1  # log2 p'
        rem = p - p2
        if rank < 2 * rem and rank % 2 == 0:  # folds into rank+1, gets the result back
            return [n], [n]
        extra = 1 if rank < 2 * rem else 0  # the partner of a folded rank
        return [n] * (steps + extra), [n] * (steps + extra)
    if algorithm == "rabenseifner":
        return _rabenseifner(p, n, rank)
    raise AssertionError(algorithm)  # unreachable: checked above


def _rabenseifner(p: int, n: int, rank: int) -> tuple[list, list]:
    p2 = largest_power_of_two(p)
    rem = p - p2
    if rank < 2 * rem and rank % 2 == 0:  # folds into rank+1, gets the result back
        return [n], [n]
    new_rank = rank // 2 if rank < 2 * rem else rank - rem
    c = chunk_sizes(n, p2)
    sent, received = [], []
    for _, _, out, into in halving_doubling_windows(new_rank, p2):
        sent.append(sum(c[out[0] : out[1]]))
        received.append(sum(c[into[0] : into[1]]))
    if rank < 2 * rem:  # the partner of a folded rank: its tensor in, the result back out
        return sent + [n], [n] + received
    return sent, received


def _check(world_size: int, rank: int | None, direction: str) -> None:
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if rank is not None and not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in range({world_size})")
    if direction not in ("send", "recv"):
        raise ValueError(f"direction must be 'send' or 'recv', got {direction!r}")


def expected_messages(
    algorithm: str, world_size: int, rank: int | None = None, *, direction: str = "send"
) -> int:
    """Messages that ``rank`` sends (or receives) in one all-reduce by ``algorithm``.

    ring: 2(p−1) per rank; recursive doubling: log2 p per rank for power-of-two p;
    Rabenseifner: 2·log2 p per rank for power-of-two p (Thakur, Rabenseifner and Gropp 2005,
    §4); naive, tree and the fold for other p as described in this module's docstring.

    Args:
        algorithm: ``"naive"``, ``"tree"``, ``"ring"``, ``"recursive_doubling"`` or
            ``"rabenseifner"``.
        world_size: number of ranks p.
        rank: the group rank; ``None`` for the total over all ranks (sent = received then).
        direction: ``"send"`` or ``"recv"``.

    Returns:
        The number of messages, empty ones (a ring chunk of 0 elements) included.

    Raises:
        ValueError: unknown algorithm or direction, ``world_size < 1``, rank out of range.
    """
    _check(world_size, rank, direction)
    ranks = range(world_size) if rank is None else [rank]
    index = 0 if direction == "send" else 1
    return sum(len(_per_rank(algorithm, world_size, 0, r)[index]) for r in ranks)


def expected_bytes(
    algorithm: str,
    world_size: int,
    numel: int,
    element_size: int,
    rank: int | None = None,
    *,
    direction: str = "send",
) -> int:
    """Bytes that ``rank`` sends (or receives) in one all-reduce of ``numel`` elements.

    ring: rank r sends every chunk but its own in the reduce-scatter and every chunk but
    chunk r+1 in the all-gather, (2n − c_r − c_{r+1}) elements ≈ 2(p−1)/p · n; recursive
    doubling: log2 p · n for power-of-two p; Rabenseifner: (n − c_r) in the halving plus the
    doubling's blocks, 2(p−1)/p · n when p divides n (Thakur, Rabenseifner and Gropp 2005, §4).

    Args:
        algorithm: ``"naive"``, ``"tree"``, ``"ring"``, ``"recursive_doubling"`` or
            ``"rabenseifner"``.
        world_size: number of ranks p.
        numel: elements in the tensor being all-reduced.
        element_size: bytes per element (``tensor.element_size()``).
        rank: the group rank; ``None`` for the total over all ranks.
        direction: ``"send"`` or ``"recv"``.

    Returns:
        The number of bytes.

    Raises:
        ValueError: as ``expected_messages``, or a negative ``numel`` / ``element_size``.
    """
    _check(world_size, rank, direction)
    if numel < 0 or element_size < 0:
        raise ValueError(f"need numel, element_size >= 0, got {numel}, {element_size}")
    ranks = range(world_size) if rank is None else [rank]
    index = 0 if direction == "send" else 1
    total = sum(sum(_per_rank(algorithm, world_size, numel, r)[index]) for r in ranks)
    return total * element_size
