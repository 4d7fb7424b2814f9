"""Communication backends written for the course, registered with torch.distributed.

Introduced in notebooks/04_custom_backend.ipynb.

Each module registers its backend when imported (``lk.launch(fn, backend="labkit_shm")`` imports
it inside every rank): ``shm`` (shared memory between ranks on one host), ``recording`` (wraps
any backend and records every operation), ``simnet`` (wraps a backend and delays each operation
as a described network would), ``cpp`` (a minimal backend in C++ built at run time).
This package imports nothing heavy itself.
"""
