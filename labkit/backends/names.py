"""labkit's own backends by name: the table the launcher reads, kept beside the backends.

Introduced in notebooks/04_custom_backend.ipynb. Adding a backend means adding its module here;
no launcher file changes. Importable without torch (the launcher checks names before any rank
starts).
"""

from __future__ import annotations

import importlib.util

# Backends that labkit implements itself: name -> module whose import registers it with
# torch.distributed. The ranks import the module before init_process_group.
LABKIT_BACKENDS: dict[str, str] = {
    "labkit_shm": "labkit.backends.shm",
    "labkit_record": "labkit.backends.recording",
    "labkit_simnet": "labkit.backends.simnet",
    "labkit_cpp": "labkit.backends.cpp",
}


def available_labkit_backends() -> list[str]:
    """labkit's own backends whose modules exist in this installation.

    Returns:
        Their names, in the table's order.
    """
    found = []
    for name, module in LABKIT_BACKENDS.items():
        try:
            if importlib.util.find_spec(module) is not None:
                found.append(name)
        except ModuleNotFoundError:
            pass
    return found
