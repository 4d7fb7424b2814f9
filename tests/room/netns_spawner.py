"""A local spawner that gives each learner's server a network namespace of its own.

For tests/room/ on one machine, standing in for DockerSpawner's one container per learner:
LocalProcessSpawner (a system user per learner) whose server process first enters the network
namespace ``/run/netns/<user name>`` (made by tests/room/hub.py, with a veth pair to the host)
and listens on that namespace's address. The learner's kernels, ranks, rendezvous store and
gloo sockets then live on a loopback interface of their own, as in a container.

The hub reads the addresses from ``LABKIT_ROOM_NETNS`` (JSON: user name -> address).
"""

from __future__ import annotations

import ctypes
import json
import os

from jupyterhub.spawner import LocalProcessSpawner

CLONE_NEWNET = 0x40000000


def enter_netns(name: str) -> None:
    """Move the calling process into the named network namespace (needs root)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


class NetnsSpawner(LocalProcessSpawner):
    """LocalProcessSpawner, each server in the network namespace named after its user."""

    def make_preexec_fn(self, name):
        drop_privileges = super().make_preexec_fn(name)

        def preexec() -> None:
            enter_netns(name)  # as root, before setuid drops the right to
            drop_privileges()

        return preexec

    async def start(self):
        self.ip = json.loads(os.environ["LABKIT_ROOM_NETNS"])[self.user.name]
        return await super().start()
