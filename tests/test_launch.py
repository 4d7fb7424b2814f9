"""lk.launch: what runs, what comes back, what the learner sees, and what it refuses."""

from __future__ import annotations

import io
import os
import sys
import threading
import time

import psutil
import pytest
import torch

import labkit as lk
from labkit.launcher._relay import is_noise
from tests.launch_helpers import owned_processes, run_script


def _sum_of_ranks(rank, world_size, scale=1):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(rank * scale)])
    dist.all_reduce(t)
    return t.item()


def test_module_function_returns_in_rank_order():
    out = lk.launch(_sum_of_ranks, world_size=3, args=(2,))
    assert out == [6.0, 6.0, 6.0]
    assert lk.launch(lambda rank, ws: (rank, ws), world_size=4) == [(r, 4) for r in range(4)]


def test_closure_and_kwargs_and_tensors_travel_by_value():
    offset = torch.arange(3.0)

    def fn(rank, world_size, *, factor):
        import torch.distributed as dist

        t = offset * factor + rank
        dist.all_reduce(t)
        return t

    out = lk.launch(fn, world_size=2, kwargs={"factor": 10})
    expected = 2 * (offset * 10) + (0 + 1)
    for t in out:
        torch.testing.assert_close(t, expected, rtol=0, atol=0)


def test_process_group_is_initialised_and_destroyed_with_env():
    def fn(rank, world_size):
        import os

        import torch.distributed as dist

        return (
            dist.is_initialized(),
            dist.get_rank(),
            dist.get_world_size(),
            dist.get_backend(),
            os.environ["RANK"],
            str(lk.get_device()),
        )

    out = lk.launch(fn, world_size=2)
    # What "auto" gives here: gloo on the CPU, or with a GPU per rank the multi-device backend
    # on cuda:r (labkit/launcher/device_rule.py).
    choice = lk.launch_choice(2)
    devices = [f"cuda:{r}" if choice.device == "cuda" else "cpu" for r in range(2)]
    assert out == [(True, r, 2, choice.backend, str(r), devices[r]) for r in range(2)]
    with pytest.raises(RuntimeError, match="not inside a rank"):
        lk.get_device()


def test_env_reaches_the_ranks_only():
    def fn(rank, world_size):
        import os

        import torch.distributed as dist

        return os.environ.get("LABKIT_TEST_VAR"), str(dist.get_debug_level())

    assert "LABKIT_TEST_VAR" not in os.environ
    env = {"LABKIT_TEST_VAR": "on", "TORCH_DISTRIBUTED_DEBUG": "INFO"}
    # torch read TORCH_DISTRIBUTED_DEBUG in the warm worker long ago; each rank reads it again.
    assert lk.launch(fn, world_size=2, env=env) == [("on", "DebugLevel.INFO")] * 2
    assert "LABKIT_TEST_VAR" not in os.environ
    assert lk.launch(fn, world_size=2) == [(None, "DebugLevel.OFF")] * 2


def test_world_size_one():
    assert lk.launch(lambda r, w: r + w, world_size=1) == [1]


def test_output_is_prefixed_and_streamed_live(monkeypatch):
    class Clock(io.StringIO):
        def __init__(self):
            super().__init__()
            self.stamps = []

        def write(self, s):
            self.stamps.append((time.monotonic(), s))
            return super().write(s)

    out, err = Clock(), Clock()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)

    def fn(rank, world_size):
        import sys
        import time

        print(f"early {rank}")
        print(f"oops {rank}", file=sys.stderr)
        time.sleep(1.5)
        print("late", end="")  # no newline: still delivered at the end

    lk.launch(fn, world_size=2)
    done = time.monotonic()
    text = out.getvalue()
    assert "[rank 0] early 0\n" in text and "[rank 1] early 1\n" in text
    assert "[rank 0] late\n" in text
    assert "[rank 1] oops 1\n" in err.getvalue()
    early = [t for t, s in out.stamps if "early" in s]
    assert early and done - max(early) > 1.0, "output arrived only at the end, not live"


def test_library_noise_hidden_unless_verbose(capsys):
    noise = (
        "[W1203 06:40:00.1 socket.cpp:767] [c10d] The hostname of the client socket "
        "cannot be retrieved. err=-3"
    )
    assert is_noise(noise)
    assert not is_noise("[rank 0] my own warning about socket.cpp")

    def fn(rank, world_size, line):
        import sys
        import warnings

        print(line, file=sys.stderr)
        warnings.warn("old API", FutureWarning, stacklevel=1)  # from the notebook: kept
        warnings.warn_explicit("torch deprecation", FutureWarning, "x.py", 1, module="torch.x")

    lk.launch(fn, world_size=2, args=(noise,))
    err = capsys.readouterr().err
    assert "hostname of the client socket" not in err
    assert "torch deprecation" not in err
    assert "old API" in err
    lk.launch(fn, world_size=2, args=(noise,), verbose=True)
    err = capsys.readouterr().err
    assert "hostname of the client socket" in err and "torch deprecation" in err


def test_nothing_listens_beyond_loopback():
    """While ranks run, every listening socket of the launcher, zygote and ranks is loopback."""
    seen: list[tuple[int, str, int]] = []
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            procs = [psutil.Process(os.getpid()), *owned_processes()]
            for p in procs:
                try:
                    conns = p.net_connections(kind="inet")
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                for c in conns:
                    if c.status == psutil.CONN_LISTEN:
                        seen.append((p.pid, c.laddr.ip, c.laddr.port))
            time.sleep(0.05)

    def fn(rank, world_size):
        import time

        import torch
        import torch.distributed as dist

        dist.all_reduce(torch.ones(4))
        time.sleep(1.5)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        lk.launch(fn, world_size=3)
    finally:
        stop.set()
        t.join()
    assert seen, "the watcher saw no listening socket at all; it cannot judge"
    public = {(pid, ip, port) for pid, ip, port in seen if ip not in ("127.0.0.1", "::1")}
    assert not public, f"sockets listening beyond loopback: {sorted(public)}"


def test_concurrent_launches_from_two_processes_do_not_collide():
    code = """
        import labkit as lk
        def fn(rank, ws):
            import time, torch, torch.distributed as dist
            t = torch.ones(1)
            for _ in range(20):
                dist.all_reduce(t); time.sleep(0.02)
            return t.item()
        for _ in range(2):
            assert lk.launch(fn, world_size=2) == [2.0**20] * 2
        print("OK")
    """
    import subprocess

    from tests.launch_helpers import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", __import__("textwrap").dedent(code)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0 and "OK" in out, err


def test_works_from_a_plain_script_and_leaves_nothing():
    r = run_script("""
        import os, labkit as lk
        print(lk.launch(lambda rank, ws: rank * 2, world_size=2))
        print("PID", os.getpid())
    """)
    assert r.returncode == 0, r.stderr
    assert "[0, 2]" in r.stdout
    pid = int(r.stdout.split("PID")[1])
    from tests.launch_helpers import wait_until

    assert wait_until(lambda: not owned_processes(pid), 10), "zygote outlived its script"


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"world_size": 0}, ValueError, "at least 1"),
        ({"world_size": -2}, ValueError, "at least 1"),
        ({"world_size": "4"}, ValueError, "must be an int"),
        ({"world_size": 10_000}, ValueError, "too many processes"),
        ({"backend": "tcp"}, ValueError, "no longer exists"),
        ({"backend": "carrier-pigeon"}, ValueError, "unknown backend"),
        ({"timeout": 0}, ValueError, "positive number"),
        ({"timeout": float("nan")}, ValueError, "positive number"),
        ({"device": "tpu"}, ValueError, "device must be"),
        ({"args": 5}, ValueError, "args must be a tuple"),
        ({"env": "A=1"}, ValueError, "env must be a dict"),
        ({"env": {"A": 1}}, ValueError, "str -> str"),
        ({"env": {"A=B": "1"}}, ValueError, "without '='"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(kwargs, exc, match):
    params = {"world_size": 2, **kwargs}
    with pytest.raises(exc, match=match):
        lk.launch(lambda r, w: None, **params)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs")
def test_gpu_requests_without_gpus_say_so():
    with pytest.raises(RuntimeError, match="GPU"):
        lk.launch(lambda r, w: None, world_size=2, backend="nccl")
    with pytest.raises(RuntimeError, match="GPU"):
        lk.launch(lambda r, w: None, world_size=2, device="cuda")
    assert lk.launch(lambda r, w: str(lk.get_device()), world_size=2) == ["cpu", "cpu"]


def test_bad_functions_and_unsendable_arguments():
    with pytest.raises(ValueError, match="must be a function"):
        lk.launch(42, world_size=2)
    with pytest.raises(ValueError, match="rank, world_size"):
        lk.launch(lambda: None, world_size=2)
    lock = threading.Lock()
    with pytest.raises(ValueError, match=r"args\[1\].*cannot be sent"):
        lk.launch(lambda r, w, a, b: None, world_size=2, args=(1, lock))
    with pytest.raises(ValueError, match="cannot be sent"):
        lk.launch(lambda r, w: lock.locked(), world_size=2)


def test_unsendable_return_value_names_the_rank():
    def fn(rank, world_size):
        import threading

        return threading.Lock() if rank == 1 else rank

    with pytest.raises(lk.RankError, match="return value of rank 1") as info:
        lk.launch(fn, world_size=2)
    assert info.value.ranks == [1]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_auto_picks_nccl_with_a_gpu_per_rank():
    def fn(rank, world_size):
        import torch
        import torch.distributed as dist

        t = torch.ones(4, device=lk.get_device()) * rank
        dist.all_reduce(t)
        flag = torch.tensor([rank])  # a CPU tensor in passing: gloo carries it
        dist.all_reduce(flag)
        return dist.get_backend(), lk.device_backend(), str(lk.get_device()), t.cpu(), flag

    out = lk.launch(fn, world_size=2)
    assert [o[0] for o in out] == ["cpu:gloo,cuda:nccl"] * 2
    assert [o[1] for o in out] == ["nccl", "nccl"]
    assert [o[2] for o in out] == ["cuda:0", "cuda:1"]
    torch.testing.assert_close(out[0][3], torch.ones(4))
    assert out[0][4].item() == 1


def _ddp_steps(rank, world_size, steps):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(16, 8) + rank).pow(2).mean().backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world_size)]
    dist.all_gather(gathered, flat)
    return all(torch.equal(g, flat) for g in gathered)


@pytest.mark.slow
def test_repeated_ddp_launches_survive_gloo_teardown():
    """gloo can abort a process at exit after DDP (seen on these machines); results arrive
    before teardown and a rank's exit after its result is never the learner's failure."""
    for _ in range(6):
        assert lk.launch(_ddp_steps, world_size=3, args=(3,)) == [True, True, True]


def _store_sum_pg(store, rank, world_size, timeout):
    """A minimal ProcessGroup written in Python: all_reduce(SUM) through the store."""
    import pickle

    import torch.distributed as dist
    from torch._C._distributed_c10d import _create_work_from_future
    from torch.futures import Future

    class StoreSumPG(dist.ProcessGroup):
        def __init__(self):
            super().__init__(rank, world_size)
            self.seq = 0

        def allreduce(self, tensors, opts):
            self.seq += 1
            store.set(f"ar{self.seq}/{rank}", pickle.dumps(tensors[0]))
            parts = [pickle.loads(store.get(f"ar{self.seq}/{r}")) for r in range(world_size)]
            tensors[0].copy_(sum(parts))
            fut = Future()
            fut.set_result(tensors)
            return _create_work_from_future(fut)

        def getBackendName(self):
            return "store_sum"

    return StoreSumPG()


def test_backend_spec_registers_a_custom_backend_in_every_rank():
    def fn(rank, world_size):
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        return dist.get_backend(), t.item()

    spec = lk.BackendSpec("store_sum", creator=_store_sum_pg)
    assert lk.launch(fn, world_size=3, backend=spec) == [("store_sum", 6.0)] * 3
    with pytest.raises(ValueError, match="creator or a module"):
        lk.BackendSpec("nothing")
    with pytest.raises(ValueError, match="identifier"):
        lk.BackendSpec("no spaces", creator=_store_sum_pg)


def test_functions_touching_torch_backends_like_modules_can_be_sent():
    """torch.backends.* are module subclasses that cloudpickle alone cannot ship."""
    import labkit.backends  # noqa: F401 - `lk.backends` next to `torch` in the code

    def fn(rank, world_size):
        return lk.backends.__name__, torch.backends.cudnn.__name__, torch.ones(1).item()

    assert lk.launch(fn, world_size=2) == [("labkit.backends", "torch.backends.cudnn", 1.0)] * 2


def test_no_rank_starts_before_every_rank_finished_init():
    # A function that leaves the group at once (notebook 00's init-method lab) must not close
    # its sockets while a peer is still in gloo's connection handshake: when fn starts, every
    # rank has counted itself in on the launch's store.
    def count_in(rank, world_size):
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store().underlying_store  # under its prefix
        seen = store.add("labkit/initialised", 0)
        dist.destroy_process_group()
        return seen

    for _ in range(3):
        assert lk.launch(count_in, 4, backend="gloo", device="cpu") == [4] * 4


def _warm_modules(rank, world_size):
    import sys

    from labkit.launcher._zygote import WARM_IMPORTS

    return [name in sys.modules for name in WARM_IMPORTS]


def test_settle_finishes_the_zygotes_warm_up_before_the_ranks_start():
    # a fresh zygote imports these while idle, also beside the first launch's ranks; settle
    # has it finish first, so ranks that time their calls have the cores (and the modules)
    lk.shutdown()
    lk.launcher.settle()
    zygote = lk.launcher.current_zygote_pid()
    assert lk.launch(_warm_modules, 2) == [[True, True, True]] * 2  # inherited, not imported
    lk.launcher.settle()  # nothing left to import: answers at once, the same zygote
    assert lk.launcher.current_zygote_pid() == zygote
