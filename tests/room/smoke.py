"""Two learners in the room's Docker images (docker/room/smoke-test.sh runs this).

Each signs up and logs in through the hub's forms, gets a container of their own from
DockerSpawner, runs a 2-rank ``lk.launch`` with an ``all_reduce`` in it and ``lk.doctor()``;
then the cross-talk probe: alice holds a ``%%ranks`` world and a shared-memory segment, bob
tries to reach them from his container.

    python -m tests.room.smoke http://127.0.0.1:18000/ alice bob
"""

from __future__ import annotations

import json
import secrets
import sys
import time

from tests.room.client import Learner
from tests.room.learner import DOCTOR, probe

LAUNCH = """\
import os, socket, torch, torch.distributed as dist, labkit as lk

def ranksum(rank, world_size):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    return t.item(), dist.get_backend()

print("launch", lk.launch(ranksum, world_size=2), "in", socket.gethostname(), "uid", os.getuid())
"""


def main(argv: list[str]) -> int:
    hub, names = argv[1], argv[2:]
    learners = [Learner(hub, name, secrets.token_urlsafe(12)) for name in names]
    report: dict = {}
    ok = True
    for learner in learners:
        start = time.monotonic()
        message = learner.sign_up()
        assert message.startswith("The signup was successful"), message
        assert learner.log_in(), f"{learner.name}: login refused"
        learner.make_token()
        spawn_s = learner.start_server(600)
        kernel = learner.kernel(timeout=300)
        try:
            launch = kernel.run(LAUNCH, 300).strip().splitlines()[-1]
            doctor = kernel.run(DOCTOR, 300)
        finally:
            kernel.close()
        report[learner.name] = {
            "server start s": round(spawn_s, 1),
            "launch": launch,
            "doctor": doctor.strip().splitlines(),
            "total s": round(time.monotonic() - start, 1),
        }
        ok &= "[(3.0, 'gloo'), (3.0, 'gloo')]" in launch
    report["probe"] = probe(learners[0], learners[1:], 300)
    for name, seen in report["probe"].items():
        if name != "owner":
            ok &= seen["store"] != "reached" and seen["segment"] != "opened"
            ok &= seen["signal"] != "allowed"
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
