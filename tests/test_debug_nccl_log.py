"""``labkit.debug.nccl_log`` on a sample in NCCL's documented line format, and on a real GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from labkit.debug import annotate_nccl_log, parse_nccl_line, read_nccl_log

SAMPLE = Path(__file__).resolve().parent / "fixtures" / "nccl_info_2ranks.log"


def test_an_info_line_is_read_field_by_field() -> None:
    line = parse_nccl_line("node-01:3873285:3873285 [0] NCCL INFO Using network IB")
    assert line is not None
    assert (line.host, line.pid, line.tid, line.device, line.level) == (
        "node-01",
        3873285,
        3873285,
        0,
        "INFO",
    )
    assert line.message == "Using network IB" and line.where == "" and line.time == ""


def test_a_warn_line_keeps_its_timestamp_and_source_location() -> None:
    line = parse_nccl_line(
        "[2026-05-05 06:16:47] node-01:189884:189884 [3] plugin/net.cc:334 NCCL WARN "
        "Failed to initialize any NET plugin"
    )
    assert line is not None and line.level == "WARN" and line.device == 3
    assert line.time == "2026-05-05 06:16:47" and line.where == "plugin/net.cc:334"
    assert line.message == "Failed to initialize any NET plugin"


@pytest.mark.parametrize(
    "text",
    ["[rank1]:gpu:7:7 [1] NCCL INFO Connected all rings", "[default0]: gpu:7:7 [1] NCCL INFO x"],
)
def test_a_launcher_prefix_is_skipped(text: str) -> None:
    line = parse_nccl_line(text)
    assert line is not None and line.host == "gpu" and line.device == 1


@pytest.mark.parametrize(
    "text", ["", "training starts", "NCCL INFO without a prefix", "host:1:2 NCCL INFO no device"]
)
def test_other_lines_are_not_nccl_lines(text: str) -> None:
    assert parse_nccl_line(text) is None


def test_the_bare_version_line_of_nccl_debug_version() -> None:
    line = parse_nccl_line("NCCL version 2.30.3+cuda13.0")
    assert line is not None and line.level == "VERSION"
    assert read_nccl_log("NCCL version 2.30.3+cuda13.0").version == "2.30.3+cuda13.0"


def test_the_sample_log_is_summarised() -> None:
    log = read_nccl_log(SAMPLE.read_text())
    assert len(log.lines) == 14  # the comment lines and the program's own line are skipped
    assert log.version == "2.27.7+cuda13.0"
    assert log.networks == {"Socket"}
    assert log.channels == 2 and log.rings_connected
    assert log.init_complete == [(0, 2, 0), (1, 2, 1)]
    assert [w.where for w in log.warnings] == ["misc/socket.cc:50"]


def test_an_empty_log_leaves_every_field_empty() -> None:
    log = read_nccl_log("no NCCL here\n")
    assert log.lines == [] and log.version is None and log.networks == set()
    assert log.channels == 0 and not log.rings_connected and log.init_complete == []


def test_annotations_keep_the_first_line_of_each_kind() -> None:
    notes = annotate_nccl_log(read_nccl_log(SAMPLE.read_text()))
    messages = [m for m, _ in notes]
    assert messages[0].startswith("Bootstrap") and messages[1] == "NCCL version 2.27.7+cuda13.0"
    assert sum(m.startswith("Channel") for m in messages) == 1
    assert sum("Init COMPLETE" in m for m in messages) == 1
    assert all(note for _, note in notes)
    two = annotate_nccl_log(read_nccl_log(SAMPLE.read_text()), per_note=2)
    assert sum("Init COMPLETE" in m for m, _ in two) == 2


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and dist.is_nccl_available()), reason="needs NCCL and a GPU"
)
def test_a_real_nccl_log_has_its_version_and_one_init_per_rank(tmp_path: Path) -> None:
    from labkit.debug import run_torchrun

    ranks = min(2, torch.cuda.device_count())
    run = run_torchrun(
        "labkit.scripts.debug_collectives",
        ["--backend", "nccl"],
        nproc=ranks,
        env={"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": f"{tmp_path}/nccl.%h.%p.log"},
    )
    assert run.returncode == 0, run.output[-3000:]
    log = read_nccl_log("\n".join(p.read_text() for p in tmp_path.glob("nccl.*.log")))
    assert log.version, "no 'NCCL version' line in the log"
    assert log.version.split("+")[0] == ".".join(map(str, torch.cuda.nccl.version()[:3]))
    assert sorted(r for r, _, _ in log.init_complete) == list(range(ranks))
