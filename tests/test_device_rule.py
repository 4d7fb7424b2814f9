"""The device rule (labkit/launcher/device_rule.py) on machines with 0, 1, 2 and 8 GPUs.

No GPU is needed: the GPU count and NCCL's availability are mocked where the launcher,
``%%ranks`` and the torchrun scripts read them, so each bug the rule exists for is a test:
CPU tensors under a group that is pure NCCL, two ranks on one GPU, two workers on one GPU
taking different backends, two torchrun agents on one host taking the same GPUs.
"""

from __future__ import annotations

import pytest

from labkit.launcher import _checks, sections
from labkit.launcher.device_rule import MULTI_DEVICE, Choice, choose, choose_for_job

GPU_COUNTS = (0, 1, 2, 8)


@pytest.mark.parametrize("gpus", GPU_COUNTS)
@pytest.mark.parametrize("world_size", (1, 2, 4, 8))
def test_auto_is_cuda_exactly_when_every_rank_has_a_gpu(gpus, world_size):
    c = choose("auto", "auto", world_size, gpus, nccl=gpus > 0)
    if 0 < world_size <= gpus:
        assert c == Choice(MULTI_DEVICE, "cuda")  # CPU tensors still have gloo
    else:
        assert (c.backend, c.device) == ("gloo", "cpu")
        # GPUs present but too few: said, never silent; no GPU at all: nothing to say
        assert bool(c.note) == (gpus > 0)
        if gpus:
            assert f"{world_size} ranks but {gpus} GPU(s)" in c.note


@pytest.mark.parametrize("gpus", GPU_COUNTS)
def test_auto_never_gives_pure_nccl(gpus):
    """Pure NCCL has no CPU path (a CPU tensor, as in the README's hello, fails): never "auto"."""
    for ws in (1, 2, 8):
        for device in ("auto", "cuda") if gpus >= ws else ("auto",):
            assert choose("auto", device, ws, gpus, nccl=True).backend != "nccl"


def test_explicit_choices_and_their_errors():
    assert choose("nccl", "auto", 2, 2, True) == Choice("nccl", "cuda")
    assert choose("gloo", "auto", 2, 8, True) == Choice("gloo", "cpu")  # gloo means CPU
    assert choose("gloo", "cuda", 2, 2, True) == Choice("gloo", "cuda")  # gloo moves CUDA too
    assert choose("labkit_shm", "auto", 4, 8, True) == Choice("labkit_shm", "cpu")
    assert choose("auto", "cpu", 2, 8, True) == Choice("gloo", "cpu")
    with pytest.raises(RuntimeError, match="world_size=2 needs 2 GPUs, this machine has 1"):
        choose("nccl", "auto", 2, 1, True)  # two ranks on one GPU: NCCL refuses
    with pytest.raises(RuntimeError, match="needs 4 GPUs"):
        choose("auto", "cuda", 4, 2, True)
    with pytest.raises(RuntimeError, match="no NCCL"):
        choose("nccl", "cuda", 1, 0, False)
    with pytest.raises(ValueError, match="CUDA tensors only"):
        choose("nccl", "cpu", 1, 1, True)
    with pytest.raises(ValueError, match="moves CPU tensors only"):
        choose("labkit_shm", "cuda", 1, 1, True)
    with pytest.raises(ValueError, match="'auto', 'cpu' or 'cuda'"):
        choose("auto", "tpu", 1, 0, True)


@pytest.fixture
def gpus(monkeypatch):
    """Set how many GPUs the launcher sees (and give the build NCCL when there are some)."""
    import torch.distributed as dist

    def set_count(n: int) -> None:
        monkeypatch.setattr(_checks, "_gpu_count", lambda: n)
        monkeypatch.setattr(sections, "gpu_count", lambda: n)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: n > 0)

    return set_count


@pytest.mark.parametrize("n", GPU_COUNTS)
def test_launch_plan_under_mocked_gpus(gpus, n, capsys):
    """What lk.launch and %%ranks (both through make_plan) resolve on each machine."""
    gpus(n)
    for ws in (1, 2, 4, 8):
        plan = _checks.make_plan(ws, "auto", "auto", 30.0, False)
        if ws <= n:
            assert (plan.backend, plan.device) == (MULTI_DEVICE, "cuda:{rank}")
        else:
            assert (plan.backend, plan.device) == ("gloo", "cpu")
    err = capsys.readouterr().err
    assert ("NCCL needs one GPU per rank" in err) == (n in (1, 2))  # 8 GPUs: every ws fits
    plan = _checks.make_plan(2, "labkit_shm", "auto", 30.0, False)
    assert (plan.backend, plan.device) == ("labkit_shm", "cpu")
    assert plan.backend_spec is not None and plan.backend_spec.module == "labkit.backends.shm"


def test_make_plan_accepts_the_multi_device_string(gpus):
    gpus(2)
    plan = _checks.make_plan(2, MULTI_DEVICE, "auto", 30.0, False)
    assert (plan.backend, plan.device) == (MULTI_DEVICE, "cuda:{rank}")


def test_a_spec_runs_on_the_devices_it_declares(gpus):
    from labkit.launcher import BackendSpec

    gpus(2)
    cuda_only = BackendSpec("mine", creator=lambda *a: None, devices=("cuda",))
    assert _checks.resolve(cuda_only, "auto", 2)[2] == "cuda:{rank}"
    with pytest.raises(ValueError, match="serves cuda tensors only"):
        _checks.resolve(cuda_only, "cpu", 2)
    with pytest.raises(RuntimeError, match="needs 4 GPUs"):
        _checks.resolve(cuda_only, "auto", 4)
    cpu_only = BackendSpec("mine", creator=lambda *a: None)
    assert _checks.resolve(cpu_only, "auto", 2)[2] == "cpu"


def host(name: str, gpus: int, visible: str = "") -> tuple[str, int]:
    return (f"{name}|{visible}", gpus)


def test_job_one_gpu_two_workers_all_take_the_cpu():
    """The old per-local-rank rule gave rank 0 NCCL and rank 1 gloo: a hang."""
    hosts = [host("a", 1), host("a", 1)]
    picks = [choose_for_job("auto", "auto", hosts, r, nccl=True) for r in range(2)]
    assert {(c.device, i) for c, i in picks} == {("cpu", 0)}
    assert "2 ranks but 1 GPU" in picks[0][0].note


def test_job_two_agents_on_one_host_get_different_gpus():
    """Two torchrun agents on one host both number their workers from local rank 0."""
    hosts = [host("a", 8)] * 4  # agent 0: ranks 0, 1; agent 1: ranks 2, 3 (same host)
    picks = [choose_for_job("auto", "auto", hosts, r, nccl=True) for r in range(4)]
    assert [c.device for c, _ in picks] == ["cuda"] * 4
    assert [i for _, i in picks] == [0, 1, 2, 3]


def test_job_agents_with_their_own_visible_devices_count_separately():
    hosts = [host("a", 2, "0,1")] * 2 + [host("a", 2, "2,3")] * 2
    assert [choose_for_job("auto", "auto", hosts, r, True)[1] for r in range(4)] == [0, 1, 0, 1]


def test_job_the_tightest_host_decides_for_all():
    hosts = [host("a", 8), host("a", 8), host("b", 1), host("b", 1)]
    picks = [choose_for_job("auto", "auto", hosts, r, True) for r in range(4)]
    assert {c.device for c, _ in picks} == {"cpu"}  # one decision, every rank alike
    assert "host 'b|'" in picks[0][0].note
    with pytest.raises(RuntimeError, match="needs 2 GPUs, this machine has 1"):
        choose_for_job("nccl", "auto", hosts, 0, True)


def test_scripts_choose_from_every_rank(monkeypatch):
    """_common._choose gathers every rank's host before deciding (here: one rank, gloo)."""
    import torch.distributed as dist

    from labkit.scripts import _common

    seen = {}

    def fake_init(backend, **kw):
        seen["backend"] = backend

    def fake_gather(out, obj, group=None):
        out[:] = [obj, ("elsewhere|", 0)]

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.setattr(dist, "all_gather_object", fake_gather)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(_common, "_gpus", lambda: 8)
    choice, index, hosts = _common._choose("auto", 0, 2, 0, 10.0)
    assert seen["backend"] == MULTI_DEVICE  # the same string on every rank, before the decision
    assert (choice.backend, choice.device, index) == (MULTI_DEVICE, "cpu", 0)  # rank 1: no GPU
    assert hosts[0][1] == 8 and len(hosts) == 2


@pytest.mark.parametrize("n", GPU_COUNTS)
def test_fit_ranks_runs_a_lesson_on_cpu_ranks_when_gpus_are_too_few(gpus, n, capsys):
    """On one GPU, `course run --device cuda` must not fail every notebook of 4 ranks."""
    import labkit as lk

    gpus(n)
    for ws in (2, 4, 8):
        for backend, device in (("nccl", "auto"), ("auto", "cuda"), ("nccl", "cuda")):
            got = lk.fit_ranks(ws, backend, device)
            assert got == ((ws, backend, device) if ws <= n else (ws, "gloo", "cpu"))
        assert lk.fit_ranks(ws, "auto", "auto") == (ws, "auto", "auto")  # the launcher decides
        assert lk.fit_ranks(ws, "labkit_shm", "cpu") == (ws, "labkit_shm", "cpu")
    err = capsys.readouterr().err
    assert ("its ranks run on the CPU over gloo" in err) == (n in (1, 2))
    assert ("no GPU is visible" in err) == (n == 0)


def test_backend_for_each_device_type():
    from labkit.launcher._context import backend_for

    assert backend_for(MULTI_DEVICE, "cuda") == "nccl"
    assert backend_for(MULTI_DEVICE, "cpu") == "gloo"
    assert backend_for("gloo", "cuda") == "gloo"
    with pytest.raises(ValueError, match="no backend for xpu tensors"):
        backend_for(MULTI_DEVICE, "xpu")


def test_inside_a_cpu_launch_the_rule_is_visible():
    import labkit as lk

    def where(rank, world_size):
        import torch.distributed as dist

        return str(lk.get_device()), lk.device_backend(), dist.get_backend()

    assert lk.launch(where, 2, device="cpu") == [("cpu", "gloo", "gloo")] * 2


def test_fit_ranks_raises_the_world_to_what_the_lesson_needs(gpus, capsys):
    import labkit as lk

    gpus(2)
    assert lk.fit_ranks(2, at_least=3, why="a server and 2 workers") == (3, "auto", "auto")
    assert "a server and 2 workers: launching 3 ranks instead of world_size=2" in (
        capsys.readouterr().err
    )
    assert lk.fit_ranks(2, at_least=4, multiple_of=2)[0] == 4
    assert lk.fit_ranks(5, at_least=4, multiple_of=2)[0] == 6
    assert lk.fit_ranks(4, at_least=4, multiple_of=2)[0] == 4
    assert capsys.readouterr().err.count("note:") == 2  # nothing said when nothing changed
    # 3 ranks on 2 GPUs, asked for NCCL: CPU ranks, said
    assert lk.fit_ranks(2, "nccl", "cuda", at_least=3) == (3, "gloo", "cpu")
    with pytest.raises(ValueError, match="positive integer"):
        lk.fit_ranks(0)


# -- %%ranks and lk.World: the plan, made before any rank starts ----------------------------


@pytest.fixture
def planned(monkeypatch):
    """``lk.World`` up to its plan, with no rank started: the plans it would start, in order."""
    from labkit.ranks import world as world_module

    plans = []

    class NoRanks:  # stands in for WorldRun, which forks the ranks from the zygote
        def __init__(self, zygote, plan, payload, listener):
            plans.append(plan)

        def start(self):
            pass

        def stop(self, grace_s):
            pass

    monkeypatch.setattr(world_module, "WorldRun", NoRanks)
    monkeypatch.setattr(world_module, "get_zygote", lambda: None)
    return plans


@pytest.mark.parametrize("n", GPU_COUNTS)
def test_ranks_magic_and_world_resolve_the_rule_under_mocked_gpus(
    gpus, planned, n, capsys, monkeypatch
):
    """`%ranks start N` and lk.World(N): the device and backend their ranks would get."""
    import labkit as lk
    from labkit.ranks.magic import RanksMagics
    from labkit.ranks.world import current_world

    gpus(n)
    monkeypatch.setattr(_checks, "_said", set())  # notes are said once per process
    magics = RanksMagics(shell=None)
    for ws in (1, 2, 4, 8):
        want = (MULTI_DEVICE, "cuda:{rank}") if ws <= n else ("gloo", "cpu")
        world = lk.World(ws)
        assert (world.backend, planned[-1].device) == want
        world.close()
        magics.ranks(f"start {ws}")  # %ranks start ws: the same plan
        assert (current_world().backend, planned[-1].device) == want
        magics.ranks(f"start {ws} --device cpu")  # the CPU whatever the machine
        assert (current_world().backend, planned[-1].device) == ("gloo", "cpu")
        magics.ranks("stop")
    assert ("NCCL needs one GPU per rank" in capsys.readouterr().err) == (n in (1, 2))
    started = len(planned)
    for line in ("start 2 --device cuda", "start 2 --backend nccl"):
        if n >= 2:
            magics.ranks(line)
            assert planned[-1].device == "cuda:{rank}"
            magics.ranks("stop")
        else:  # refused before any rank starts, with the reason
            with pytest.raises(RuntimeError, match="needs 2 GPUs|no NCCL"):
                magics.ranks(line)
            assert len(planned) == started and current_world() is None


# -- the torchrun lab scripts: one decision for every worker --------------------------------


@pytest.fixture
def job(monkeypatch):
    """``_common._choose`` for every rank of a job on one host with ``n`` GPUs (mocked)."""
    import torch.distributed as dist

    from labkit.scripts import _common

    def run(n: int, world_size: int, backend: str = "auto"):
        monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: None)
        monkeypatch.setattr(dist, "new_group", lambda **kw: None)
        monkeypatch.setattr(dist, "destroy_process_group", lambda group=None: None)
        # every rank publishes the same host and count: all_gather_object hands back the list
        gather = lambda out, obj, group=None: out.__setitem__(slice(None), [obj] * len(out))  # noqa: E731
        monkeypatch.setattr(dist, "all_gather_object", gather)
        monkeypatch.setattr(dist, "is_nccl_available", lambda: n > 0)
        monkeypatch.setattr(_common, "_gpus", lambda: n)
        return [_common._choose(backend, r, world_size, 0, 10.0)[:2] for r in range(world_size)]

    return run


@pytest.mark.parametrize("n", GPU_COUNTS)
@pytest.mark.parametrize("workers", (1, 2, 4, 8))
def test_scripts_on_one_host_under_mocked_gpus(job, n, workers):
    from labkit.launcher._context import backend_for

    picks = job(n, workers)
    assert len({(c.backend, c.device, c.note) for c, _ in picks}) == 1  # one decision for all
    choice = picks[0][0]
    if workers <= n:  # a GPU per worker: worker r on GPU r, its CUDA tensors over NCCL
        assert choice.device == "cuda" and [i for _, i in picks] == list(range(workers))
        assert backend_for(choice.backend, "cuda") == "nccl"
    else:  # every worker on the CPU over gloo, said when there are GPUs
        assert choice.device == "cpu" and {i for _, i in picks} == {0}
        assert backend_for(choice.backend, "cpu") == "gloo"
        assert bool(choice.note) == (n > 0)


def test_scripts_one_gpu_two_workers_both_take_the_cpu_over_gloo(job):
    """The old per-local-rank rule gave worker 0 NCCL on the GPU and worker 1 gloo: a hang."""
    from labkit.launcher._context import backend_for

    picks = job(1, 2)
    assert [(c.device, backend_for(c.backend, c.device)) for c, _ in picks] == [("cpu", "gloo")] * 2
    assert "2 ranks but 1 GPU(s)" in picks[0][0].note


def test_scripts_two_agents_on_one_host_take_different_gpus(monkeypatch, job):
    """`torchrun --nnodes 2 --nproc-per-node 1` twice on one 2-GPU host: both workers have
    LOCAL_RANK 0, yet they get cuda:0 and cuda:1, and init() selects that GPU."""
    import torch

    from labkit.scripts import _common

    assert [i for _, i in job(2, 2)] == [0, 1]
    selected, contexts = [], []
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda on: None)
    monkeypatch.setattr(_common, "set_rank_context", lambda *a: contexts.append(a))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    for rank in (0, 1):
        for key, value in (("RANK", rank), ("WORLD_SIZE", 2), ("LOCAL_RANK", 0)):
            monkeypatch.setenv(key, str(value))
        assert str(_common.init().device) == f"cuda:{rank}"
    assert [str(d) for d in selected] == ["cuda:0", "cuda:1"]
    assert [c[3] for c in contexts] == [MULTI_DEVICE] * 2


# -- GPU-only sections and CPU labs of the notebooks ----------------------------------------


@pytest.mark.parametrize("n", GPU_COUNTS)
def test_gpu_sections_follow_the_device_parameter(gpus, n, capsys):
    """`course run --device cpu` keeps every GPU-only section off the GPUs, and says so."""
    import labkit as lk

    gpus(n)
    assert lk.section_gpus("cpu", need=1, what="the section") == 0
    assert "skipped: the section: device='cpu' keeps" in capsys.readouterr().out
    for device in ("auto", "cuda"):
        for need in (1, 2):
            assert lk.section_gpus(device, need=need, what="the section") == (n if n >= need else 0)
            out = capsys.readouterr().out
            assert ("skipped: the section: it needs" in out) == (n < need)
    with pytest.raises(ValueError, match="'auto', 'cpu' or 'cuda'"):
        lk.section_gpus("tpu")
    with pytest.raises(ValueError, match="positive integer"):
        lk.section_gpus("auto", need=0)


@pytest.mark.parametrize("n", GPU_COUNTS)
def test_cpu_labs_say_they_run_on_the_cpu(gpus, n, capsys):
    """A CPU lab says so under "auto" on a GPU machine too, not only for explicit CUDA."""
    import labkit as lk

    gpus(n)
    cases = [
        ("auto", "auto"),
        ("nccl", "auto"),
        (MULTI_DEVICE, "auto"),
        ("auto", "cuda"),
        ("nccl", "cuda"),
        ("auto", "cpu"),
        ("gloo", "auto"),
        ("labkit_shm", "auto"),
    ]
    for backend, device in cases:
        cpu = "labkit_shm" if backend == "labkit_shm" else "gloo"
        assert lk.cpu_lab(backend, device, what="the models") == cpu
        said = f"the models run on CPU tensors: they run on the CPU over {cpu}"
        expected = (
            device == "cuda"
            or backend in ("nccl", MULTI_DEVICE)
            or (backend == device == "auto" and n > 0)
        )
        assert (said in capsys.readouterr().err) == expected, (backend, device)
