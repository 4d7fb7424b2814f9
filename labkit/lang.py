"""The language a learner reads labkit's feedback in: English, or a translation of the course.

Introduced in notebooks/00_setup_and_launcher.ipynb.

The code cells of every language of a notebook are the same, so a notebook cannot say which
language it is in; the language is found, in this order:

1. ``lk.set_language("zh-CN")`` in the kernel (``None`` returns to the lookup below);
2. the ``LABKIT_LANG`` environment variable (``labkit course run --lang zh-CN`` sets it for the
   kernels it starts);
3. the notebook's path, which Jupyter Server gives its kernels in ``JPY_SESSION_NAME``: a
   notebook under a folder named after a language (``notebooks/zh-CN/...``) is in that language;
4. otherwise English.
"""

from __future__ import annotations

import os
from pathlib import PurePath

ENGLISH = "en"
TRANSLATIONS = ("zh-CN",)  # the languages the course is translated into
_chosen: str | None = None


def set_language(lang: str | None) -> None:
    """Choose the language of labkit's feedback in this process (``None``: look it up again).

    Raises:
        ValueError: a language the course is not translated into.
    """
    global _chosen
    if lang is not None and lang not in (ENGLISH, *TRANSLATIONS):
        raise ValueError(f"no language {lang!r}; choose {ENGLISH!r} or one of {TRANSLATIONS}")
    _chosen = lang


def language() -> str:
    """The language feedback is given in now: ``"en"`` or one of ``TRANSLATIONS``."""
    if _chosen is not None:
        return _chosen
    env = os.environ.get("LABKIT_LANG", "").strip()
    if env in (ENGLISH, *TRANSLATIONS):
        return env
    parts = PurePath(os.environ.get("JPY_SESSION_NAME", "")).parts[:-1]
    for lang in TRANSLATIONS:
        if lang in parts:
            return lang
    return ENGLISH
