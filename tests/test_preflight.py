"""Tests for labkit.preflight (lk.doctor): report, renderings, exit codes, no CUDA init."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

import labkit as lk
from labkit.preflight import host as doctor_host
from labkit.preflight import stale as doctor_stale
from labkit.preflight import torch_cuda as doctor_torch_cuda
from tests.test_preflight_gpu import fake_nvidia_smi

doctor_mod = importlib.import_module("labkit.preflight")  # the module, whatever lk.doctor is
Check, DoctorReport = doctor_mod.Check, doctor_mod.DoctorReport

NAMES = [
    "python",
    "torch",
    "torch.distributed",
    "gloo",
    "nccl",
    "gpus",
    "torch cuda",
    "cuda state",
    "cpu",
    "memory",
    "/dev/shm",
    "loopback",
    "tcp port",
    "stale processes",
    "jupyter",
    "c++ compiler",
]


@pytest.fixture
def sample() -> DoctorReport:
    return DoctorReport(
        [
            Check("python", "ok", "3.11.7 at /x/python", seconds=0.002),
            Check("gpus", "warn", "2 GPU(s)\n0: A\n1: B", "free GPU 1 <now>"),
            Check("tcp port", "fail", "cannot bind", "check the <firewall> & loopback"),
        ]
    )


def refuse_port() -> int:
    raise OSError(99, "Cannot assign requested address")


def test_doctor_runs_every_check_and_prints_nothing(capsys):
    report = doctor_mod.doctor()
    assert [c.name for c in report.checks] == NAMES
    for check in report.checks:
        assert check.status in ("ok", "warn", "fail")
        assert check.detail
        assert check.status == "ok" or check.fix, check
    assert report.ok == all(c.status != "fail" for c in report.checks)
    assert capsys.readouterr() == ("", "")


def test_lk_doctor_is_callable_whatever_was_imported_first():
    # The preflight package is imported above; lk.doctor is still the function.
    assert isinstance(lk.doctor(), DoctorReport)


def test_text_table_is_aligned(sample):
    lines = str(sample).splitlines()
    assert lines[0] == "labkit doctor: 1 ok, 1 warn, 1 fail — not ready: fix the FAIL lines"
    assert lines[1] == "ok    python    3.11.7 at /x/python"
    assert lines[2] == "WARN  gpus      2 GPU(s)"
    assert lines[3:6] == [" " * 16 + "0: A", " " * 16 + "1: B", " " * 16 + "fix: free GPU 1 <now>"]
    assert lines[6] == "FAIL  tcp port  cannot bind"
    assert lines[7] == " " * 16 + "fix: check the <firewall> & loopback"
    assert len(lines) == 8  # no fix line for the ok check
    assert repr(sample) == str(sample)


def test_verbose_table_shows_times(sample):
    sample.verbose = True
    assert str(sample).splitlines()[1] == "ok    python         2 ms  3.11.7 at /x/python"
    assert "<th>time</th>" in sample._repr_html_()


def test_long_fix_wraps_under_its_column():
    fix = "word " * 60
    text = str(DoctorReport([Check("x", "warn", "d", fix)]))
    fix_lines = text.splitlines()[2:]
    assert len(fix_lines) > 1
    assert all(len(line) <= 100 and line.startswith(" " * 9) for line in fix_lines)


def test_html_table_escapes_and_colours(sample):
    page = sample._repr_html_()
    assert page.count("<tr>") == 1 + len(sample.checks)
    assert "check the &lt;firewall&gt; &amp; loopback" in page
    assert "<firewall>" not in page
    assert "2 GPU(s)<br>0: A<br>1: B" in page
    assert "#f8d7da" in page and "#fff3cd" in page and "#d4edda" in page


def test_to_dict_is_json(sample):
    data = json.loads(json.dumps(sample.to_dict()))
    assert data["ok"] is False
    assert data["counts"] == {"ok": 1, "warn": 1, "fail": 1}
    assert data["checks"][2] == {
        "name": "tcp port",
        "status": "fail",
        "detail": "cannot bind",
        "fix": "check the <firewall> & loopback",
        "seconds": 0.0,
    }
    assert sample["gpus"].status == "warn"
    with pytest.raises(KeyError):
        sample["nope"]


def test_main_exit_code_zero_here(capsys):
    assert doctor_mod.main([]) == 0  # this machine must pass the preflight
    out = capsys.readouterr().out
    assert out.startswith("labkit doctor: ") and "fail — ready" in out


def test_main_exit_code_one_when_a_check_fails(monkeypatch, capsys):
    monkeypatch.setattr(doctor_host, "_bind_loopback_port", refuse_port)
    assert doctor_mod.main([]) == 1
    assert "\nFAIL  tcp port" in capsys.readouterr().out
    assert doctor_mod.main(["--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False
    assert {c["name"]: c["status"] for c in data["checks"]}["tcp port"] == "fail"


def test_main_kill_stale_flag_reaches_the_check(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(
        doctor_stale, "check_stale", lambda kill=False: seen.append(kill) or Check("s", "ok", "")
    )
    assert doctor_mod.main(["--kill-stale", "--verbose"]) == 0
    assert seen == [True]
    assert " ms  " in capsys.readouterr().out


def test_a_crashing_check_becomes_a_warning(monkeypatch):
    def broken() -> Check:
        raise RuntimeError("boom")

    monkeypatch.setattr(doctor_host, "check_compiler", broken)
    check = doctor_mod.doctor()["c++ compiler"]
    assert check.status == "warn"
    assert "RuntimeError: boom" in check.detail and "bug" in check.fix


FORBIDDEN = ("init", "_lazy_init", "is_available", "device_count", "get_device_properties",
             "get_device_capability", "mem_get_info", "current_device", "set_device")  # fmt: skip
H100_ROW = "echo 'NVIDIA H100 80GB HBM3, 81559 MiB, 1 MiB, 580.65.06, 9.0'\n"


def forbid_cuda_calls(monkeypatch) -> list[str]:
    touched: list[str] = []

    def forbidden(name):
        def call(*args, **kwargs):
            touched.append(name)
            raise AssertionError(f"the doctor called torch.cuda.{name}")

        return call

    for name in FORBIDDEN:
        monkeypatch.setattr(torch.cuda, name, forbidden(name))
    return touched


def test_doctor_with_gpus_listed_asks_torch_in_a_subprocess_only(monkeypatch, tmp_path):
    # nvidia-smi lists 2 H100s and torch looks like the CUDA 13.0 wheel; this process must not
    # initialise CUDA: the real probe runs in a child (whose CPU torch answers False).
    fake_nvidia_smi(tmp_path, H100_ROW * 2)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    touched = forbid_cuda_calls(monkeypatch)
    report = doctor_mod.doctor()
    assert touched == []
    assert not torch.cuda.is_initialized()
    assert report["cuda state"].status == "ok"
    assert report["gpus"].detail.startswith("2 GPU(s) via nvidia-smi")
    check = report["torch cuda"]
    assert check.status == "warn"
    assert "torch.cuda.is_available() is False" in check.detail
    assert "at most" not in report["cpu"].detail  # no GPU for NCCL: CPU advice only


def test_doctor_world_size_advice_counts_the_gpus_torch_can_use(monkeypatch, tmp_path):
    fake_nvidia_smi(tmp_path, H100_ROW * 2)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_90"])
    probe = doctor_torch_cuda.TorchCuda(True, 2, ((9, 0), (9, 0)), ("sm_80", "sm_90"))
    monkeypatch.setattr(doctor_torch_cuda, "probe_torch_cuda", lambda: probe)
    touched = forbid_cuda_calls(monkeypatch)
    report = doctor_mod.doctor()
    assert touched == [] and not torch.cuda.is_initialized()
    assert report["torch cuda"].status == "ok"
    assert "a notebook's world_size may be at most 2;" in report["cpu"].detail


def test_doctor_never_initialises_cuda(monkeypatch, tmp_path):
    touched = forbid_cuda_calls(monkeypatch)
    # Even on a "CUDA build" without nvidia-smi the doctor must ask a subprocess instead.
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setenv("PATH", str(tmp_path))
    report = doctor_mod.doctor()
    assert touched == []
    assert not torch.cuda.is_initialized()
    assert report["cuda state"].status == "ok"
    assert report["gpus"].detail == "no GPU: the course runs on CPU with gloo"
