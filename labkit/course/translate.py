"""The course in other languages, from one source: catalogues of translated markdown cells.

Introduced in notebooks/00_setup_and_launcher.ipynb.

The English notebooks (``notebooks/NN_*.ipynb``) are the source. A translation is a catalogue
per notebook, ``notebooks/i18n/<lang>/NN_*.json``, keyed by cell id::

    {"notebook": "05_communication_cost.ipynb", "lang": "zh-CN",
     "cells": {"<cell id>": {"en_sha256": "<first 16 hex of the English text's sha256>",
                             "text": "<the translated markdown>"}}}

Only markdown cells are translated; code cells are the English notebook's, copied, so both
languages run the same code. ``build`` writes ``notebooks/<lang>/NN_*.ipynb`` from the English
notebook and its catalogue, and refuses (``TranslationError``) when a markdown cell has no
translation or a stale one (its English text changed since: the hash differs), or when the
catalogue names cells the notebook no longer has. ``problems`` lists the same without writing,
and ``built_is_current`` says whether the committed Chinese notebooks are what ``build``
writes, which the test suite checks.

    labkit course translate --lang zh-CN            # write notebooks/zh-CN/ (fails on drift)
    labkit course translate --lang zh-CN --check    # only report drift; exit 1 if any
    labkit course translate --lang zh-CN --skeleton 05 --to /tmp/05.json
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

LANGUAGES = ("zh-CN",)  # the languages the course is translated into (English is the source)
CATALOGUE_DIR = "i18n"


class TranslationError(ValueError):
    """A catalogue does not match its English notebook; the message lists every problem."""


@dataclass(frozen=True)
class Problem:
    notebook: str
    cell_id: str
    kind: str  # "missing", "stale", "orphan", "empty"
    cell_index: int | None = None

    def __str__(self) -> str:
        where = f"cell {self.cell_index} " if self.cell_index is not None else ""
        what = {
            "missing": "has no translation",
            "stale": "changed in English since it was translated (the hash differs)",
            "orphan": "is translated but no longer in the English notebook",
            "empty": "has an empty translation",
        }[self.kind]
        return f"{self.notebook}: {where}(id {self.cell_id}) {what}"


def source_hash(text: str) -> str:
    """The hash a catalogue records for an English cell: sha256 of its text, 16 hex digits."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def cell_text(cell: dict) -> str:
    src = cell.get("source", "")
    return src if isinstance(src, str) else "".join(src)


def check_language(lang: str) -> str:
    if lang not in LANGUAGES:
        raise ValueError(f"no translation {lang!r}; the course has {', '.join(LANGUAGES)}")
    return lang


def english_notebooks(notebooks_dir: Path) -> list[Path]:
    """The course's English notebooks, in order."""
    return sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb"))


def catalogue_path(notebooks_dir: Path, lang: str, notebook: Path) -> Path:
    return Path(notebooks_dir) / CATALOGUE_DIR / lang / f"{Path(notebook).stem}.json"


def built_path(notebooks_dir: Path, lang: str, notebook: Path) -> Path:
    return Path(notebooks_dir) / lang / Path(notebook).name


def load_catalogue(path: Path) -> dict:
    if not path.exists():
        return {"cells": {}}
    return json.loads(path.read_text(encoding="utf-8"))


def save_catalogue(path: Path, notebook: Path, lang: str, cells: dict[str, dict]) -> None:
    """Write a catalogue with its cells in the English notebook's order."""
    order = {c.get("id"): i for i, c in enumerate(_read(notebook)["cells"])}
    ordered = dict(sorted(cells.items(), key=lambda kv: order.get(kv[0], len(order))))
    data = {"notebook": Path(notebook).name, "lang": lang, "cells": ordered}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")


def _read(path: Path) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _markdown(nb: dict) -> Iterable[tuple[int, dict]]:
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            if not cell.get("id"):
                raise TranslationError(f"cell {i} has no id (nbformat 4.5 ids are the keys)")
            yield i, cell


def notebook_problems(notebook: Path, catalogue: dict) -> list[Problem]:
    """What keeps ``catalogue`` from translating ``notebook`` (empty when it is complete)."""
    nb, name = _read(notebook), Path(notebook).name
    cells = catalogue.get("cells", {})
    out, seen = [], set()
    for i, cell in _markdown(nb):
        cid = cell["id"]
        seen.add(cid)
        entry = cells.get(cid)
        if entry is None:
            out.append(Problem(name, cid, "missing", i))
        elif entry.get("en_sha256") != source_hash(cell_text(cell)):
            out.append(Problem(name, cid, "stale", i))
        elif not entry.get("text", "").strip():
            out.append(Problem(name, cid, "empty", i))
    out += [Problem(name, cid, "orphan") for cid in cells if cid not in seen]
    return out


def problems(notebooks_dir: Path, lang: str) -> list[Problem]:
    """Every missing, stale, empty or orphaned translation of the course in ``lang``."""
    check_language(lang)
    return [
        p
        for nb in english_notebooks(notebooks_dir)
        for p in notebook_problems(nb, load_catalogue(catalogue_path(notebooks_dir, lang, nb)))
    ]


def translated_notebook(notebook: Path, catalogue: dict, lang: str) -> dict:
    """The notebook in ``lang``: translated markdown, the English code cells unchanged.

    Raises:
        TranslationError: a markdown cell has no current translation (each one listed).
    """
    bad = notebook_problems(notebook, catalogue)
    if bad:
        raise TranslationError("\n".join(str(p) for p in bad))
    nb = copy.deepcopy(_read(notebook))
    for _, cell in _markdown(nb):
        cell["source"] = catalogue["cells"][cell["id"]]["text"].splitlines(True)
    nb["metadata"]["labkit_translation"] = {"lang": lang, "source": f"../{Path(notebook).name}"}
    return nb


def _dump(nb: dict) -> str:
    return json.dumps(nb, ensure_ascii=False, indent=1) + "\n"


def build(notebooks_dir: Path, lang: str, only: Iterable[Path] | None = None) -> list[Path]:
    """Write ``notebooks/<lang>/`` from the English notebooks and their catalogues.

    Returns:
        The notebooks written.

    Raises:
        TranslationError: some translation is missing or stale; nothing was written.
    """
    check_language(lang)
    notebooks = list(only) if only is not None else english_notebooks(notebooks_dir)
    built = {
        nb: translated_notebook(nb, load_catalogue(catalogue_path(notebooks_dir, lang, nb)), lang)
        for nb in notebooks
    }
    written = []
    for nb, translated in built.items():
        out = built_path(notebooks_dir, lang, nb)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_dump(translated), encoding="utf-8")
        written.append(out)
    return written


def built_is_current(notebooks_dir: Path, lang: str, notebook: Path) -> bool:
    """Whether ``notebooks/<lang>/<name>`` is exactly what ``build`` would write now."""
    out = built_path(notebooks_dir, lang, notebook)
    if not out.exists():
        return False
    catalogue = load_catalogue(catalogue_path(notebooks_dir, lang, notebook))
    try:
        want = _dump(translated_notebook(notebook, catalogue, lang))
    except TranslationError:
        return False
    return out.read_text(encoding="utf-8") == want


def code_cells(nb: dict) -> list[tuple[str | None, str]]:
    """The (id, source) of every code cell: what two languages of one notebook must share."""
    return [(c.get("id"), cell_text(c)) for c in nb["cells"] if c["cell_type"] == "code"]


def skeleton(notebooks_dir: Path, lang: str, notebook: Path) -> dict:
    """A catalogue to fill in: every markdown cell with its English text and hash, the current
    translation where one exists, and whether it is stale."""
    catalogue = load_catalogue(catalogue_path(notebooks_dir, lang, notebook))
    cells = {}
    for i, cell in _markdown(_read(notebook)):
        text, old = cell_text(cell), catalogue.get("cells", {}).get(cell["id"], {})
        cells[cell["id"]] = {
            "index": i,
            "en": text,
            "en_sha256": source_hash(text),
            "text": old.get("text", ""),
            "stale": bool(old) and old.get("en_sha256") != source_hash(text),
        }
    return {"notebook": Path(notebook).name, "lang": lang, "cells": cells}


def import_filled(notebooks_dir: Path, lang: str, filled: dict) -> Path:
    """Store a filled skeleton as the notebook's catalogue (English text and indices dropped)."""
    notebook = Path(notebooks_dir) / filled["notebook"]
    cells = {
        cid: {"en_sha256": e["en_sha256"], "text": e["text"]}
        for cid, e in filled["cells"].items()
        if e.get("text", "").strip()
    }
    path = catalogue_path(notebooks_dir, lang, notebook)
    save_catalogue(path, notebook, lang, cells)
    return path


def translated_dir(notebooks: str | Path | None, lang: str, only=None) -> Path:
    """The folder of the course in ``lang`` (``labkit course run --lang``).

    Raises:
        ValueError: an unknown language, or selected notebooks whose translation is not built
            from the current English notebook and catalogue (the message says what to run).
    """
    from labkit.course.run import default_notebooks_dir, find_notebooks, select_notebooks

    english_dir = Path(notebooks) if notebooks else default_notebooks_dir()
    check_language(lang)
    stale = [
        nb.name
        for nb in select_notebooks(find_notebooks(english_dir), only)
        if not built_is_current(english_dir, lang, nb)
    ]
    if stale:
        raise ValueError(
            f"the {lang} notebooks are not built from the current English ones and catalogues: "
            f"{', '.join(stale)}; run `labkit course translate --lang {lang}` (it lists what is "
            "missing)"
        )
    return english_dir / lang


def command(notebooks: str | Path | None, lang: str, check: bool = False) -> int:
    """``labkit course translate``: list what is missing or stale, else build (exit status)."""
    import sys

    from labkit.course.run import default_notebooks_dir

    folder = Path(notebooks) if notebooks else default_notebooks_dir()
    try:
        found = problems(folder, lang)
    except ValueError as exc:
        print(f"labkit: error: {exc}", file=sys.stderr)
        return 2
    for p in found:
        print(p)
    if found:
        print(f"{len(found)} cell(s) to translate in notebooks/{CATALOGUE_DIR}/{lang}/")
        return 1
    if check:
        print(f"every markdown cell has a current {lang} translation")
        return 0
    written = build(folder, lang)
    print(f"wrote {len(written)} notebooks to {folder / lang}")
    return 0
