"""The package's face: a light import, a complete public API, sizes that stay readable."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import labkit as lk

ROOT = Path(__file__).resolve().parents[1]


def test_import_labkit_is_light():
    code = (
        "import sys, json, labkit; "
        "print(json.dumps(sorted(m for m in ('torch', 'matplotlib', 'papermill', 'ipywidgets',"
        " 'numpy') if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert json.loads(out.stdout) == []


def test_public_api_resolves():
    for name in lk.__all__:
        assert getattr(lk, name) is not None, name


def test_modules_stay_short():
    long = {
        str(p.relative_to(ROOT)): n
        for p in (ROOT / "labkit").rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"split these by concept: {long}"
