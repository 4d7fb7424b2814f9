"""The parts of the ``labkit_shm`` backend (see ``labkit/backends/shm.py``).

Introduced in notebooks/04_custom_backend.ipynb.

``layout`` and ``segment`` (the shared memory: where things are, how it is created and
cleaned up), ``sync`` (rounds, waiting, dead peers, timeouts) and ``futex`` (blocking waits
on a shared word), ``describe`` (the descriptor check), ``allreduce`` and ``collectives`` (the
algorithms), ``calls`` (c10d calls to algorithm calls), ``mailbox`` and ``p2p`` (send/recv),
``group`` (the ProcessGroup class).
"""
