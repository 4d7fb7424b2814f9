"""The pieces of the ``labkit_shm`` backend (see ``labkit/backends/shm.py``).

Introduced in notebooks/04_custom_backend.ipynb.

``segment`` (the shared memory and its layout), ``sync`` (rounds, waiting, failures),
``describe`` (descriptor checks), ``collectives`` (the algorithms), ``mailbox`` and ``p2p``
(send/recv), ``group`` (the ProcessGroup class).
"""
