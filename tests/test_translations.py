"""The course in Chinese from one source: catalogues current, code shared, terms, feedback.

Every markdown cell of every English notebook has a current zh-CN translation (its catalogue
records the hash of the English it translates: a cell changed in English and not in Chinese
fails here, naming the cell); ``notebooks/zh-CN/`` is exactly what ``labkit course translate``
writes, so its code cells are the English ones; the glossary's checked terms are used; every
message an exercise checker can give has a translation, and a Chinese notebook's learner reads
the feedback in Chinese. Running the Chinese notebooks: ``tests/test_notebooks.py``.
"""

from __future__ import annotations

import json
import re
import string
import subprocess
import sys
from pathlib import Path

import pytest

import labkit as lk
from labkit.course import translate as tr
from labkit.exercises import _messages as messages

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
ENGLISH = tr.english_notebooks(NOTEBOOKS)
LANG = "zh-CN"
CJK = re.compile(r"[\u4e00-\u9fff]")


def test_every_markdown_cell_has_a_current_translation() -> None:
    problems = tr.problems(NOTEBOOKS, LANG)
    assert not problems, (
        f"{len(problems)} cell(s) without a current {LANG} translation (update the catalogue in "
        f"notebooks/i18n/{LANG}/, then `labkit course translate --lang {LANG}`):\n"
        + "\n".join(map(str, problems[:40]))
    )


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.stem[:2])
def test_the_chinese_notebook_is_built_from_the_catalogue(path: Path) -> None:
    assert tr.built_is_current(NOTEBOOKS, LANG, path), (
        f"notebooks/{LANG}/{path.name} is not what `labkit course translate --lang {LANG}` "
        "writes from the English notebook and its catalogue: rebuild it (never edit it by hand)"
    )


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.stem[:2])
def test_code_cells_are_the_english_ones(path: Path) -> None:
    english = json.loads(path.read_text(encoding="utf-8"))
    chinese = json.loads(tr.built_path(NOTEBOOKS, LANG, path).read_text(encoding="utf-8"))
    assert tr.code_cells(chinese) == tr.code_cells(english)
    kinds = [(c["cell_type"], c.get("id"), c.get("metadata")) for c in english["cells"]]
    assert [(c["cell_type"], c.get("id"), c.get("metadata")) for c in chinese["cells"]] == kinds
    markdown = [tr.cell_text(c) for c in chinese["cells"] if c["cell_type"] == "markdown"]
    assert all(CJK.search(t) for t in markdown if re.search(r"[A-Za-z]{4}", t)), (
        "a markdown cell with English words has no Chinese in it"
    )


def _glossary() -> list[tuple[str, str]]:
    """The checked (✓) rows of docs/glossary.zh-CN.md: (English term, Chinese term)."""
    rows = []
    for line in (ROOT / "docs" / "glossary.zh-CN.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[2] == "✓":
            english = re.sub(r"\s*\(.*?\)", "", cells[0])
            chinese = re.split(r"[（(]", cells[1])[0].strip()
            rows.append((english, chinese))
    return rows


def _prose(markdown: str) -> str:
    """Markdown without code, math and link targets: the words a term check reads."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", " ", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", " ", text, flags=re.S)
    return re.sub(r"\]\([^)]*\)", "]", text)


def test_glossary_has_checked_terms() -> None:
    terms = dict(_glossary())
    assert terms["data parallelism"] == "数据并行" and terms["all-reduce"] == "全归约"
    assert len(terms) >= 15


@pytest.mark.parametrize("path", ENGLISH, ids=lambda p: p.stem[:2])
def test_checked_terms_follow_the_glossary(path: Path) -> None:
    catalogue = tr.load_catalogue(tr.catalogue_path(NOTEBOOKS, LANG, path))["cells"]
    english = json.loads(path.read_text(encoding="utf-8"))
    missing = []
    for cell in english["cells"]:
        if cell["cell_type"] != "markdown" or cell["id"] not in catalogue:
            continue
        en, zh = _prose(tr.cell_text(cell)), catalogue[cell["id"]]["text"]
        for term, chinese in _glossary():
            if re.search(rf"(?<![\w-]){re.escape(term)}(?![\w-])", en, re.I) and chinese not in zh:
                missing.append(f"cell {cell['id']}: '{term}' without '{chinese}'")
    assert not missing, "\n".join(missing)


# --- the catalogue machinery on a notebook made here ------------------------------------------


def _notebook(folder: Path, markdown: str, code: str = "x = 1") -> Path:
    nb = {
        "cells": [
            {"cell_type": "markdown", "id": "m1", "metadata": {}, "source": markdown},
            {
                "cell_type": "code",
                "id": "c1",
                "metadata": {},
                "source": code,
                "outputs": [],
                "execution_count": None,
            },
        ],  # fmt: skip
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = folder / "01_demo.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_a_changed_english_cell_makes_its_translation_stale(tmp_path: Path) -> None:
    nb = _notebook(tmp_path, "Data parallelism splits the batch.")
    filled = tr.skeleton(tmp_path, LANG, nb)
    assert [p.kind for p in tr.notebook_problems(nb, {"cells": {}})] == ["missing"]
    filled["cells"]["m1"]["text"] = "数据并行切分批次。"
    tr.import_filled(tmp_path, LANG, filled)
    assert tr.problems(tmp_path, LANG) == []
    (out,) = tr.build(tmp_path, LANG)
    built = json.loads(out.read_text(encoding="utf-8"))
    assert tr.cell_text(built["cells"][0]) == "数据并行切分批次。"
    assert tr.code_cells(built) == [("c1", "x = 1")]
    _notebook(tmp_path, "Data parallelism splits the batch across ranks.")  # English changed
    (stale,) = tr.problems(tmp_path, LANG)
    assert stale.kind == "stale" and "hash differs" in str(stale)
    assert not tr.built_is_current(tmp_path, LANG, nb)
    with pytest.raises(tr.TranslationError, match="changed in English"):
        tr.build(tmp_path, LANG)


def test_a_hand_edited_chinese_notebook_is_not_current(tmp_path: Path) -> None:
    nb = _notebook(tmp_path, "Text.")
    filled = tr.skeleton(tmp_path, LANG, nb)
    filled["cells"]["m1"]["text"] = "文本。"
    tr.import_filled(tmp_path, LANG, filled)
    (out,) = tr.build(tmp_path, LANG)
    assert tr.built_is_current(tmp_path, LANG, nb)
    out.write_text(out.read_text(encoding="utf-8").replace("x = 1", "x = 2"), encoding="utf-8")
    assert not tr.built_is_current(tmp_path, LANG, nb)


def test_orphaned_and_empty_translations_are_problems(tmp_path: Path) -> None:
    nb = _notebook(tmp_path, "Text.")
    sha = tr.source_hash("Text.")
    catalogue = {"cells": {"m1": {"en_sha256": sha, "text": " "}, "gone": {"text": "旧"}}}
    assert sorted(p.kind for p in tr.notebook_problems(nb, catalogue)) == ["empty", "orphan"]


def test_course_run_refuses_a_stale_translation(tmp_path: Path) -> None:
    _notebook(tmp_path, "Text.")
    proc = subprocess.run(
        [sys.executable, "-m", "labkit.cli", "course", "run", "--lang", LANG,
         "--notebooks", str(tmp_path), "--output", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "labkit course translate --lang zh-CN" in proc.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "labkit.cli", "course", "translate", "--lang", "fr",
         "--notebooks", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "no translation 'fr'" in bad.stderr


# --- the exercises' feedback -----------------------------------------------------------------


def _fields(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}


def test_every_checker_message_has_a_translation_and_nothing_else() -> None:
    english = messages.templates()
    catalogue = messages.catalogue(LANG)
    missing = sorted(english - catalogue.keys())
    orphans = sorted(catalogue.keys() - english)
    assert not missing, "untranslated (add to labkit/exercises/messages/zh-CN.json):\n" + "\n".join(
        missing
    )
    assert not orphans, "no longer in the checkers' source:\n" + "\n".join(orphans)
    for en, zh in catalogue.items():
        assert _fields(zh) <= _fields(en), (en, zh)
        assert CJK.search(zh), zh


def test_template_of_numbers_fields_and_reads_sums(tmp_path: Path) -> None:
    src = tmp_path / "nbxx.py"
    src.write_text(
        "def check(rank, n, hint):\n"
        "    raise ExerciseFailed(f'rank {rank} sent {n:d} {{x}} message(s). ' + hint)\n"
        "def _hint(k):\n"
        "    return 'use a ring' if k else f'use {k} steps'\n"
    )
    assert messages.templates([src]) == {
        "rank {0} sent {1} {{x}} message(s). {2}",
        "use a ring",
        "use {0} steps",
    }


def test_translate_fills_the_fields_and_translates_nested_messages(monkeypatch) -> None:
    monkeypatch.setattr(
        messages,
        "catalogue",
        lambda lang: {
            "rank {0} sent {1} message(s). {2}": "rank {0} 发送了 {1} 条消息。{2}",
            "use a ring": "用环形算法",
        },  # fmt: skip
    )
    messages._patterns.cache_clear()
    try:
        got = messages.translate("rank 3 sent 2 message(s). use a ring", "zh-CN")
        assert got == "rank 3 发送了 2 条消息。用环形算法"
        assert messages.translate("something else", "zh-CN") == "something else"
        assert messages.translate("use a ring", "en") == "use a ring"
    finally:
        messages._patterns.cache_clear()


def _wrong_ring_cost(n_bytes, world_size, alpha, beta, gamma):
    return 2 * (world_size - 1) * (alpha + n_bytes * beta)  # whole tensor each step


def test_a_chinese_learner_reads_the_feedback_in_chinese(monkeypatch, capsys) -> None:
    monkeypatch.setenv("LABKIT_LANG", "zh-CN")
    with pytest.raises(lk.exercises.ExerciseFailed) as info:
        lk.exercises.check("05_ring_cost", _wrong_ring_cost)
    message = str(info.value)
    assert "带宽项不对" in message and "the bandwidth term" not in message
    out = capsys.readouterr().out
    assert out.startswith("✗ 05_ring_cost：") and "环形算法需要" in out
    lk.exercises.check("05_ring_cost", lk.exercises.solution("05_ring_cost"))
    assert capsys.readouterr().out.strip() == "✓ 05_ring_cost：正确"
    monkeypatch.setenv("LABKIT_LANG", "en")
    with pytest.raises(lk.exercises.ExerciseFailed, match="the bandwidth term is off"):
        lk.exercises.check("05_ring_cost", _wrong_ring_cost)


def test_the_language_comes_from_the_kernel_the_environment_or_the_notebook_path(
    monkeypatch,
) -> None:
    monkeypatch.delenv("LABKIT_LANG", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert lk.language() == "en"
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/learner/notebooks/zh-CN/05_cost.ipynb")
    assert lk.language() == "zh-CN"
    monkeypatch.setenv("JPY_SESSION_NAME", "/home/learner/notebooks/05_cost.ipynb")
    assert lk.language() == "en"
    monkeypatch.setenv("LABKIT_LANG", "zh-CN")
    assert lk.language() == "zh-CN"
    lk.set_language("en")
    try:
        assert lk.language() == "en"
        with pytest.raises(ValueError, match="no language 'fr'"):
            lk.set_language("fr")
    finally:
        lk.set_language(None)
    assert lk.language() == "zh-CN"


def test_the_readme_has_a_chinese_quickstart() -> None:
    readme = (ROOT / "README.zh-CN.md").read_text(encoding="utf-8")
    english = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in ("make course", "make test", "labkit course run --fast --lang zh-CN"):
        assert command in readme, command
    assert "README.zh-CN.md" in english
