"""Tests for labkit.preflight.host: cores, memory, /dev/shm, loopback, packages, compiler."""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
from collections import namedtuple

import psutil
import pytest

from labkit.preflight import host as host

GIB = 1 << 30
DiskUsage = namedtuple("DiskUsage", "total used free")
Memory = namedtuple("Memory", "total available")


def test_usable_cores_measures_this_process():
    cores, detail = host.usable_cores()
    assert 1 <= cores <= (os.cpu_count() or 1)
    assert f"{os.cpu_count()} cores" in detail
    if hasattr(os, "sched_getaffinity"):
        assert cores <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "text, cpus", [("200000 100000\n", 2.0), ("max 100000\n", None), ("junk", None)]
)
def test_cgroup_quota(tmp_path, text, cpus):
    path = tmp_path / "cpu.max"
    path.write_text(text)
    assert host._cgroup_cpus(path) == cpus
    assert host._cgroup_cpus(tmp_path / "missing") is None


@pytest.mark.parametrize(
    "cores, n_gpus, status, advice",
    [
        (1, 0, "warn", "world_size 2 suits"),
        (2, 0, "ok", "world_size 2 suits"),
        (16, 0, "ok", "world_size 4 suits"),
        (16, 8, "ok", "8 GPU(s) for NCCL, one rank per GPU"),
    ],
)
def test_cpu_advice(monkeypatch, cores, n_gpus, status, advice):
    monkeypatch.setattr(host, "usable_cores", lambda: (cores, f"{cores} cores"))
    check = host.check_cpu(n_gpus)
    assert check.status == status
    assert advice in check.detail
    assert bool(check.fix) == (status == "warn")


def test_memory(monkeypatch):
    assert host.check_memory().detail.endswith("GiB available")
    monkeypatch.setattr(psutil, "virtual_memory", lambda: Memory(3 * GIB, 1 * GIB))
    check = host.check_memory()
    assert check.status == "warn"
    assert check.detail == "3.0 GiB total, 1.0 GiB available"
    assert "world_size=2" in check.fix


def test_tiny_shm_warns_louder_with_gpus(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(64 << 20, 0, 64 << 20))
    cpu = host.check_shm(0, str(tmp_path))
    gpu = host.check_shm(2, str(tmp_path))
    assert cpu.status == gpu.status == "warn"
    assert cpu.detail == "0.06 GiB (0.06 GiB free)"
    assert "NCCL will crash" in gpu.fix
    assert "--ipc=host" in gpu.fix and "--shm-size=8g" in gpu.fix
    assert "NCCL will crash" not in cpu.fix


def test_big_shm_ok_and_missing_shm_skipped(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "disk_usage", lambda path: DiskUsage(8 * GIB, 0, 8 * GIB))
    assert host.check_shm(2, str(tmp_path)).status == "ok"
    check = host.check_shm(2, str(tmp_path / "no-shm"))
    assert check.status == "ok" and "nothing to check" in check.detail


@pytest.mark.parametrize(
    "interfaces, status", [([(1, "lo"), (2, "eth0")], "ok"), ([(1, "lo0")], "ok"),
                           ([(2, "eth0")], "fail")]
)  # fmt: skip
def test_loopback(monkeypatch, interfaces, status):
    monkeypatch.setattr(socket, "if_nameindex", lambda: interfaces)
    check = host.check_loopback()
    assert check.status == status
    assert bool(check.fix) == (status == "fail")


def test_tcp_port(monkeypatch):
    check = host.check_tcp_port()
    assert check.status == "ok"
    assert 0 < int(check.detail.rsplit(":", 1)[1]) < 65536

    def refuse() -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(host, "_bind_loopback_port", refuse)
    check = host.check_tcp_port()
    assert check.status == "fail" and "Permission denied" in check.detail


def test_jupyter_packages(monkeypatch):
    assert host.check_jupyter().status == "ok"  # the venv has all five
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "nbval" else real(name)
    )
    check = host.check_jupyter()
    assert check.status == "warn"
    assert check.detail.startswith("nbval missing (notebook tests);")
    assert check.fix == "pip install 'nbval==0.11.0'"  # the pin in requirements-dev.txt


def test_compiler(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/c++" if name == "c++" else None)
    assert host.check_compiler().detail == "/usr/bin/c++"
    monkeypatch.setattr(shutil, "which", lambda name: None)
    check = host.check_compiler()
    assert check.status == "warn" and "g++" in check.fix
