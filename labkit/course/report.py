"""The course report: ``summary.json`` and a self-contained ``report.html``.

Introduced in notebooks/00_setup_and_launcher.ipynb (``labkit course run`` writes both).

The HTML file carries its CSS inline and its figures as ``data:`` URIs, so it can be mailed
or attached to a CI run on its own. Everything taken from a notebook is HTML-escaped.
"""

from __future__ import annotations

import datetime
import html
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labkit.course.readback import NotebookResult, read_executed

_CSS = """
body { font: 15px/1.45 system-ui, sans-serif; margin: 2rem auto; max-width: 60rem; color: #222; }
h1 { margin-bottom: 0.2rem; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: left; vertical-align: top; }
th { background: #f6f6f6; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { background: #f6f8fa; padding: 0.7rem; overflow-x: auto; font-size: 13px; }
.status { display: inline-block; padding: 0 0.5rem; border-radius: 0.6rem; color: #fff; }
.status.ok { background: #1a7f37; } .status.failed { background: #cf222e; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.3rem 0; }
.muted { color: #666; } .evalue { white-space: pre-wrap; }
"""


def machine_info() -> dict[str, Any]:
    """Describe the machine the course ran on: Python, torch, CPUs, memory, GPUs, date.

    Returns:
        A JSON-ready dict; ``gpus`` is a list of ``"name (N GiB)"`` (empty without CUDA);
        ``cuda_runtime``, ``nvidia_driver`` and ``nccl`` are versions or ``"none"`` (see
        :func:`gpu_stack`).
    """
    info: dict[str, Any] = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }
    if hasattr(os, "sched_getaffinity"):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    # nvidia-smi (or torch in a subprocess): CUDA stays uninitialised in this process, which
    # may be a notebook kernel that forks ranks afterwards.
    from labkit.preflight.gpu import query_gpus

    info["gpus"] = [f"{g.name} ({g.memory_total_mib / 1024:.0f} GiB)" for g in query_gpus().gpus]
    info.update(gpu_stack())
    from labkit import __version__

    info["labkit"] = __version__
    return info


def nvidia_driver_version() -> str:
    """The NVIDIA driver version, from ``nvidia-smi`` (or NVML via ``pynvml``); else "none".

    Returns:
        e.g. ``"570.124.06"``, or ``"none"`` when neither answers.
    """
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            done = subprocess.run(
                [smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            lines = done.stdout.split()
            if done.returncode == 0 and lines:
                return lines[0]  # one line per GPU, all the same driver
        except (OSError, subprocess.TimeoutExpired):
            pass
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no pynvml, no libnvidia-ml, no driver: all mean "none"
        return "none"


def gpu_stack() -> dict[str, str]:
    """CUDA runtime, NVIDIA driver and NCCL versions, without initialising CUDA here.

    The CUDA runtime is the one torch was built with and ships (``torch.version.cuda``); NCCL's
    version (``torch.cuda.nccl.version()``, which asks the library, not a GPU) is read only
    when a CUDA GPU is visible (``torch.cuda.device_count()``, NVML-based).

    Returns:
        ``{"cuda_runtime": ..., "nvidia_driver": ..., "nccl": ...}``, each ``"none"`` if absent.
    """
    info = {"cuda_runtime": "none", "nvidia_driver": nvidia_driver_version(), "nccl": "none"}
    try:
        import torch
    except ImportError:
        return info
    info["cuda_runtime"] = torch.version.cuda or "none"
    if torch.version.cuda and torch.cuda.device_count() > 0:
        try:
            info["nccl"] = ".".join(str(part) for part in torch.cuda.nccl.version())
        except (RuntimeError, AttributeError, TypeError):
            pass  # a CUDA build without NCCL
    return info


def launches_text(launches: Sequence[dict[str, Any]]) -> str:
    """What a notebook's ranks ran on, e.g. ``"gloo/cpu ×2 (3 launches), nccl/cuda ×4"``.

    Args:
        launches: a result's ``launches`` (backend, device, world_size per launch).

    Returns:
        Distinct combinations in first-seen order, or ``"no launch"``.
    """
    counts: dict[tuple, int] = {}
    for la in launches:
        key = (la["backend"], la["device"], la["world_size"])
        counts[key] = counts.get(key, 0) + 1
    parts = [
        f"{b}/{d} ×{w}" + (f" ({n} launches)" if n > 1 else "") for (b, d, w), n in counts.items()
    ]
    return ", ".join(parts) or "no launch"


# The report's words, per language (``labkit course run --lang``; ``labkit.lang``).
WORDS = {
    "en": {
        "title": "labkit course report",
        "summary": "{n} notebooks, {verdict}, {seconds:.1f} s in all",
        "all_ok": "all ok",
        "failed": "{n} failed",
        "machine": "Machine",
        "notebooks": "Notebooks",
        "columns": (
            "notebook",
            "status",
            "seconds",
            "backend/device ×ranks",
            "recorded",
            "figures",
        ),
        "line": "{seconds:.1f} s · parameters: {parameters} · ranks ran on: {launches} · "
        "executed notebook: {link}",
        "defaults": "defaults",
        "recorded": "Recorded numbers",
        "figures": "Figures",
        "figure_alt": "figure {i} of {name}",
        "error": "Error",
        "raised": "{where} raised <b>{ename}</b>: ",
        "cell": "cell {n}",
        "the_notebook": "the notebook",
        "failing_cell": "Failing cell",
        "traceback": "Traceback",
    },
    "zh-CN": {
        "title": "labkit 课程运行报告",
        "summary": "{n} 个笔记本，{verdict}，共 {seconds:.1f} 秒",
        "all_ok": "全部通过",
        "failed": "{n} 个失败",
        "machine": "机器",
        "notebooks": "笔记本",
        "columns": ("笔记本", "状态", "秒", "后端/设备 ×rank 数", "记录的数值", "图"),
        "line": "{seconds:.1f} 秒 · 参数：{parameters} · rank 运行于：{launches} · "
        "执行后的笔记本：{link}",
        "defaults": "默认值",
        "recorded": "记录的数值",
        "figures": "图",
        "figure_alt": "{name} 的第 {i} 张图",
        "error": "错误",
        "raised": "{where} 抛出了 <b>{ename}</b>：",
        "cell": "第 {n} 个单元格",
        "the_notebook": "该笔记本",
        "failing_cell": "出错的单元格",
        "traceback": "回溯",
    },
}


def _words() -> dict[str, Any]:
    from labkit.lang import language

    return WORDS.get(language(), WORDS["en"])


def write_report(
    results: Sequence[NotebookResult],
    output_dir: str | Path,
    machine: dict[str, Any] | None = None,
) -> Path:
    """Write ``summary.json`` and ``report.html`` for a course run.

    Figures are read back from each result's executed notebook.

    Args:
        results: the run's results, in order (as from ``run_course``).
        output_dir: folder to write into (created if missing).
        machine: machine description; None means :func:`machine_info`.

    Returns:
        The path of ``report.html``.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info() if machine is None else machine
    summary = {
        "ok": all(r.ok for r in results),
        "machine": machine,
        "notebooks": [r.to_dict() for r in results],
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    report = output_dir / "report.html"
    report.write_text(render_html(results, machine, output_dir), encoding="utf-8")
    return report


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def _anchor(name: str) -> str:
    return "nb-" + re.sub(r"[^A-Za-z0-9_-]", "-", name)


def _figures(result: NotebookResult) -> list[str]:
    if not result.output_path.exists():
        return []
    import nbformat

    return read_executed(nbformat.read(result.output_path, as_version=4)).figures


def _link(result: NotebookResult, output_dir: Path) -> str:
    try:
        return result.output_path.resolve().relative_to(output_dir.resolve()).as_posix()
    except ValueError:
        return result.output_path.resolve().as_uri()


def _section(result: NotebookResult, output_dir: Path) -> list[str]:
    w = _words()
    link = f'<a href="{_e(_link(result, output_dir))}">{_e(result.output_path.name)}</a>'
    parameters = _e(json.dumps(result.parameters)) if result.parameters else w["defaults"]
    parts = [
        f'<section id="{_anchor(result.name)}">',
        f'<h2>{_e(result.name)} <span class="status {_e(result.status)}">'
        f"{_e(result.status)}</span></h2>",
        "<p>"
        + w["line"].format(
            seconds=result.seconds,
            parameters=parameters,
            launches=_e(launches_text(result.launches)),
            link=link,
        )
        + "</p>",
    ]
    if result.records:
        parts.append(f"<h3>{w['recorded']}</h3><table>")
        parts += [
            f'<tr><th>{_e(k)}</th><td class="num">{_e(_fmt(v))}</td></tr>'
            for k, v in result.records.items()
        ]
        parts.append("</table>")
    figures = _figures(result)
    if figures:
        parts.append(f"<h3>{w['figures']}</h3>")
        parts += [
            f'<img src="data:image/png;base64,{_e(png)}" '
            f'alt="{_e(w["figure_alt"].format(i=i, name=result.name))}">'
            for i, png in enumerate(figures, 1)
        ]
    if result.error is not None:
        err = result.error
        where = (
            w["cell"].format(n=err.cell_index + 1)
            if err.cell_index is not None
            else w["the_notebook"]
        )
        parts.append(
            f"<h3>{w['error']}</h3><p>{w['raised'].format(where=_e(where), ename=_e(err.ename))}"
            f'<span class="evalue">{_e(err.evalue)}</span></p>'
        )
        if result.failing_cell is not None:
            parts.append(f"<h4>{w['failing_cell']}</h4><pre>{_e(result.failing_cell)}</pre>")
        if err.traceback:
            parts.append(f"<h4>{w['traceback']}</h4><pre>{_e(err.traceback)}</pre>")
    parts.append("</section>")
    return parts


def render_html(
    results: Sequence[NotebookResult], machine: dict[str, Any], output_dir: str | Path
) -> str:
    """The report as one HTML document (inline CSS, figures as data URIs, all text escaped).

    Args:
        results: the run's results, in order.
        machine: as from :func:`machine_info`.
        output_dir: where the report will live (links to executed notebooks are relative).

    Returns:
        The HTML text.
    """
    from labkit.lang import language

    w = _words()
    output_dir = Path(output_dir)
    failed = [r for r in results if not r.ok]
    total_s = sum(r.seconds for r in results)
    verdict = w["all_ok"] if not failed else w["failed"].format(n=len(failed))
    summary = w["summary"].format(n=len(results), verdict=verdict, seconds=total_s)
    lang = language() if language() in WORDS else "en"
    parts = [
        f'<!DOCTYPE html>\n<html lang="{lang}"><head><meta charset="utf-8">',
        f"<title>{w['title']}</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>{w['title']}</h1>",
        f'<p class="muted">{_e(summary)}</p>',
        f"<h2>{w['machine']}</h2><table>",
    ]
    for key, value in machine.items():
        shown = (", ".join(value) or "none") if isinstance(value, list) else value
        parts.append(f"<tr><th>{_e(key)}</th><td>{_e(shown)}</td></tr>")
    parts.append(f"</table><h2>{w['notebooks']}</h2><table>")
    parts.append("<tr>" + "".join(f"<th>{c}</th>" for c in w["columns"]) + "</tr>")
    for r in results:
        parts.append(
            f'<tr><td><a href="#{_anchor(r.name)}">{_e(r.name)}</a></td>'
            f'<td><span class="status {_e(r.status)}">{_e(r.status)}</span></td>'
            f'<td class="num">{r.seconds:.1f}</td><td>{_e(launches_text(r.launches))}</td>'
            f'<td class="num">{len(r.records)}</td>'
            f'<td class="num">{r.figures}</td></tr>'
        )
    parts.append("</table>")
    for r in results:
        parts += _section(r, output_dir)
    parts.append("</body></html>\n")
    return "\n".join(parts)
