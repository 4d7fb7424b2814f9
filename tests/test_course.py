"""The headless course runner and the ``labkit`` command, end to end on tiny fixture notebooks.

    .venv/bin/python -m pytest tests/test_course.py

Fixtures (tests/notebooks/): ``ok`` declares ``fast``, records two numbers and draws a figure;
``broken`` raises in its third cell; ``noparams`` has no parameters cell; ``slow`` sleeps past
a short cell timeout. They are copied into a course folder as ``NN_name.ipynb``. Tests that
start kernels are marked ``slow``.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest

from labkit.cli import main
from labkit.course import run_notebook, select_notebooks

FIXTURES = Path(__file__).resolve().parent / "notebooks"
SLOW = pytest.mark.slow  # starts Jupyter kernels: a few seconds each
BROKEN_SOURCE = 'raise ValueError("cell three <fails> on purpose")'


def _course(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        shutil.copy(FIXTURES / f"{name}.ipynb", folder / f"{i:02d}_{name}.ipynb")
    return folder


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def course_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One in-process ``labkit course run`` over ok, broken and noparams."""
    root = tmp_path_factory.mktemp("course")
    notebooks = _course(root / "notebooks", "ok", "broken", "noparams")
    output = root / "out"
    code, stdout, stderr = _main(
        "course", "run", "--fast", "--world-size", "3", "--no-progress",
        "--notebooks", str(notebooks), "--output", str(output),
    )  # fmt: skip
    summary = json.loads((output / "summary.json").read_text())
    return {
        "code": code,
        "stdout": stdout,
        "stderr": stderr,
        "output": output,
        "summary": summary,
        "by_name": {nb["name"]: nb for nb in summary["notebooks"]},
        "html": (output / "report.html").read_text(encoding="utf-8"),
    }


@SLOW
def test_statuses_and_exit_code(course_run: dict) -> None:
    assert course_run["code"] == 1
    statuses = {name: nb["status"] for name, nb in course_run["by_name"].items()}
    assert statuses == {"00_ok.ipynb": "ok", "01_broken.ipynb": "failed", "02_noparams.ipynb": "ok"}
    assert course_run["summary"]["ok"] is False
    assert "failed: 01_broken.ipynb" in course_run["stdout"]
    assert "2 of 3 notebooks ok" in course_run["stdout"]
    for name in statuses:  # every notebook's executed copy is kept, the failed one too
        assert (course_run["output"] / name).is_file()


@SLOW
def test_recorded_numbers_in_summary_and_report(course_run: dict) -> None:
    ok = course_run["by_name"]["00_ok.ipynb"]
    assert ok["records"] == {"n_points": 4, "mean": 1.5}  # n_points is 10 without fast
    html = course_run["html"]
    assert '<tr><th>n_points</th><td class="num">4</td></tr>' in html
    assert '<tr><th>mean</th><td class="num">1.5</td></tr>' in html


@SLOW
def test_figure_is_embedded_as_png(course_run: dict) -> None:
    assert course_run["by_name"]["00_ok.ipynb"]["figures"] == 1
    html = course_run["html"]
    prefix = '<img src="data:image/png;base64,'
    assert html.count(prefix) == 1
    encoded = html.split(prefix, 1)[1].split('"', 1)[0]
    assert base64.b64decode(encoded).startswith(b"\x89PNG\r\n\x1a\n")
    assert "<link" not in html and "<script" not in html  # nothing fetched from elsewhere


@SLOW
def test_failure_shows_cell_source_and_error(course_run: dict) -> None:
    broken = course_run["by_name"]["01_broken.ipynb"]
    assert broken["error"]["ename"] == "ValueError"
    assert broken["error"]["evalue"] == "cell three <fails> on purpose"
    assert broken["error"]["cell_index"] == 2  # the third cell
    assert broken["failing_cell"] == BROKEN_SOURCE
    assert broken["records"] == {"before": 1}  # the cell after the failure never ran
    html = course_run["html"]
    section = html.split('id="nb-01_broken-ipynb"', 1)[1].split("</section>", 1)[0]
    assert "cell 3 raised <b>ValueError</b>" in section
    assert "raise ValueError(&quot;cell three &lt;fails&gt; on purpose&quot;)" in section
    assert "Traceback" in section
    assert "<fails>" not in html  # escaped everywhere
    assert "\x1b[" not in html and "\x1b[" not in json.dumps(course_run["summary"])
    assert "cell 3: ValueError: cell three <fails> on purpose" in course_run["stdout"]


@SLOW
def test_parameters_injected_only_when_declared(course_run: dict) -> None:
    by_name, output = course_run["by_name"], course_run["output"]
    assert by_name["00_ok.ipynb"]["parameters"] == {"fast": True}
    assert by_name["02_noparams.ipynb"]["parameters"] == {}
    assert by_name["02_noparams.ipynb"]["records"] == {"saw_fast": False}

    def injected(name: str) -> list[str]:
        nb = nbformat.read(output / name, as_version=4)
        tagged = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
        return [c.source for c in tagged]

    [ok_source] = injected("00_ok.ipynb")
    assert "fast = True" in ok_source and "world_size" not in ok_source
    assert injected("02_noparams.ipynb") == []


@SLOW
def test_report_describes_the_machine(course_run: dict) -> None:
    machine = course_run["summary"]["machine"]
    assert machine["python"] == sys.version.split()[0]
    assert machine["cpu_count"] >= 1 and isinstance(machine["gpus"], list)
    import torch

    assert machine["torch"] == torch.__version__
    assert f"<tr><th>torch</th><td>{torch.__version__}</td></tr>" in course_run["html"]


@SLOW
def test_only_runs_the_selected_notebooks(tmp_path: Path) -> None:
    notebooks = _course(tmp_path / "notebooks", "ok", "broken", "noparams")
    code, stdout, _ = _main(
        "course", "run", "--only", "2", "--no-progress",
        "--notebooks", str(notebooks), "--output", str(tmp_path / "out"),
    )  # fmt: skip
    assert code == 0, stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [nb["name"] for nb in summary["notebooks"]] == ["02_noparams.ipynb"]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.ipynb")) == ["02_noparams.ipynb"]

    code, _, stderr = _main("course", "run", "--only", "07", "--notebooks", str(notebooks))
    assert code == 2
    assert "--only 07: no such notebook" in stderr and "00_ok.ipynb" in stderr


def test_select_notebooks_by_number_or_name() -> None:
    paths = [Path("00_a.ipynb"), Path("03_b.ipynb"), Path("10_c.ipynb")]
    assert select_notebooks(paths, ["3", "00"]) == [paths[0], paths[1]]
    assert select_notebooks(paths, ["10_c"]) == [paths[2]]
    assert select_notebooks(paths, None) == paths
    with pytest.raises(ValueError, match="04"):
        select_notebooks(paths, ["04"])


@SLOW
def test_cell_timeout_fails_the_notebook(tmp_path: Path) -> None:
    result = run_notebook(FIXTURES / "slow.ipynb", tmp_path, cell_timeout=2)
    assert result.status == "failed"
    assert result.error is not None and result.error.ename == "CellTimeoutError"
    assert result.error.cell_index == 1
    assert result.failing_cell == "time.sleep(60)"


@SLOW
def test_console_script_exits_non_zero_on_failure(tmp_path: Path) -> None:
    notebooks = _course(tmp_path / "notebooks", "ok", "broken")
    labkit = Path(sys.executable).with_name("labkit")
    proc = subprocess.run(
        [str(labkit), "course", "run", "--only", "01", "--notebooks", str(notebooks),
         "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failed: 01_broken.ipynb" in proc.stdout
    assert (tmp_path / "out" / "report.html").is_file()


def test_course_list_shows_declared_parameters(tmp_path: Path) -> None:
    notebooks = _course(tmp_path / "notebooks", "ok", "noparams")
    code, stdout, _ = _main("course", "list", "--notebooks", str(notebooks))
    assert code == 0
    lines = stdout.splitlines()
    ok_line = lines.index("00_ok.ipynb")
    assert lines[ok_line + 1].split() == ["fast:", "bool", "=", "False", "#", "fewer", "points"]
    assert lines[lines.index("01_noparams.ipynb") + 1].strip() == "(no parameters cell)"


def test_help_and_version() -> None:
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stdout(io.StringIO()) as out:
        main(["--help"])
    assert exit_info.value.code == 0
    for word in ("course", "doctor", "version", "labkit course run --fast"):
        assert word in out.getvalue()
    code, stdout, _ = _main("version")
    from labkit import __version__

    assert code == 0 and stdout.startswith(f"labkit {__version__}")


def test_doctor_delegates_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    fake = types.ModuleType("labkit.preflight")
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "labkit.preflight", fake)
    assert _main("doctor", "--json", "--help")[0] == 3
    assert seen == [["--json", "--help"]]


def test_doctor_missing_is_explained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "labkit.preflight", None)  # import raises ModuleNotFound
    monkeypatch.setitem(sys.modules, "labkit.doctor", None)
    code, _, stderr = _main("doctor")
    assert code == 2
    assert "labkit doctor is not available" in stderr


def test_cli_stays_light() -> None:
    code = (
        "import sys, labkit.cli; labkit.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'papermill', 'nbformat', 'matplotlib') "
        "if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
