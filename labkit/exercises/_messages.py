"""The exercise checkers' feedback in the learner's language.

A checker writes its message in English, usually as an f-string:
``raise ExerciseFailed(f"rank {rank} sent {n} message(s)")``. Its *template* is that string
with each replacement field numbered in order: ``"rank {0} sent {1} message(s)"``.
``labkit/exercises/messages/<lang>.json`` maps each template to its translation, which may
reorder the fields (``"rank {0} 发送了 {1} 条消息"``). ``translate`` reads an English message
back through the templates (the literal text between the fields must match) and fills the
translation's fields with the same values; a message no template matches stays in English.

``templates()`` reads every template from the checkers' source, so the test suite can check
that the catalogue translates each one and nothing else (``tests/test_translations.py``).
"""

from __future__ import annotations

import ast
import functools
import json
import re
import string
from pathlib import Path

from labkit.lang import ENGLISH, language

CATALOGUE_DIR = Path(__file__).with_name("messages")
_HERE = Path(__file__).parent

# What ``check`` itself prints, by language (the English is the key).
VERDICTS = {
    "zh-CN": {
        "correct": "✓ {name}：正确",
        "wrong": "✗ {name}：{message}",
        "reference": (
            "… {name}：尚未作答——参考答案通过了这项检查。"
            "把 NotImplementedError 换成你的代码，再运行这个单元格。"
        ),
    }
}


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def template_of(node: ast.expr) -> str | None:
    """The template of a message expression (``None`` when it has no literal text of its own).

    A string is its own template (literal braces doubled, as ``str.format`` reads them); in an
    f-string each replacement field becomes a numbered field; in a sum of strings each operand
    that is neither becomes a field too (its value is translated on its own, see ``translate``).
    """
    parts: list[str | None] = []

    def walk(n: ast.expr) -> None:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add):
            walk(n.left)
            walk(n.right)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            parts.append(_escape(n.value))
        elif isinstance(n, ast.JoinedStr):
            for v in n.values:
                parts.append(_escape(str(v.value)) if isinstance(v, ast.Constant) else None)
        else:
            parts.append(None)

    walk(node)
    if all(p is None for p in parts):
        return None
    out, k = [], 0
    for p in parts:
        if p is None:
            out.append(f"{{{k}}}")
            k += 1
        else:
            out.append(p)
    return "".join(out)


def _is_message_function(name: str) -> bool:
    # Functions whose return value is (part of) a message: hints and diagnoses.
    return name.startswith(("_hint", "_diagnos", "_never_came_hint", "_group_rank_hint"))


def templates(sources=None) -> set[str]:
    """Every template a learner can read in a checker's message: ``ExerciseFailed(...)``'s
    argument, what the hint and diagnosis helpers return, and the launch messages
    (``_failures``' upper-case templates)."""
    found = set()
    for path in sources if sources is not None else sorted(_HERE.glob("*.py")):
        tree = ast.parse(Path(path).read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            exprs: list[ast.expr] = []
            if isinstance(node, ast.Call) and node.args:
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name == "ExerciseFailed":
                    exprs.append(node.args[0])
            elif isinstance(node, ast.FunctionDef) and _is_message_function(node.name):
                exprs += [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
            elif isinstance(node, ast.Assign) and Path(path).name == "_failures.py":
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id.isupper():
                    exprs.append(node.value)
            for expr in exprs:
                for sub in ast.walk(expr):  # conditional parts: ``a if c else b``
                    if isinstance(sub, ast.IfExp):
                        exprs += [sub.body, sub.orelse]
                tpl = template_of(expr)
                if tpl is not None and any(ch.isalpha() for ch in tpl):
                    if Path(path).name == "_failures.py" and isinstance(node, ast.Assign):
                        tpl = expr.value  # already a str.format template with named fields
                    found.add(tpl)
    return found


def fields(template: str) -> list[str]:
    """The numbered fields of a template, in order of appearance (``["0", "1"]``)."""
    return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]


@functools.cache
def catalogue(lang: str) -> dict[str, str]:
    """English template → translated template, for ``lang`` (empty for English)."""
    path = CATALOGUE_DIR / f"{lang}.json"
    if lang == ENGLISH or not path.exists():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))["messages"]


@functools.cache
def _patterns(lang: str) -> list[tuple[re.Pattern, list[str], str]]:
    out = []
    # Longer templates first: with more literal text they are the more specific reading.
    for english, translated in sorted(catalogue(lang).items(), key=lambda kv: -len(kv[0])):
        regex, names = [], []
        for literal, field, _, _ in string.Formatter().parse(english):
            regex.append(re.escape(literal))
            if field is not None:
                regex.append(f"(?P<f{len(names)}>.*?)")
                names.append(field)
        out.append((re.compile("".join(regex) + r"\Z", re.S), names, _plain(translated)))
    return out


def _plain(template: str) -> str:
    """A template with its fields' format specs and conversions dropped: the values it is
    filled with are the English message's text, already formatted."""
    out = []
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(_escape(literal))
        if field is not None:
            out.append(f"{{{field}}}")
    return "".join(out)


def translate(message: str, lang: str | None = None, _depth: int = 0) -> str:
    """``message`` in ``lang`` (default: the learner's language) through the templates.

    The values in a message's fields are translated too where they are messages themselves
    (a hint after a sentence); a message that no template reads stays in English.
    """
    lang = lang or language()
    if lang == ENGLISH or _depth > 3:
        return message
    for pattern, names, translated in _patterns(lang):
        m = pattern.match(message)
        if not m:
            continue
        values = [translate(m.group(f"f{i}"), lang, _depth + 1) for i in range(len(names))]
        positional = [v for n, v in zip(names, values, strict=True) if n.isdigit()]
        named = {n: v for n, v in zip(names, values, strict=True) if not n.isdigit()}
        return translated.format(*positional, **named)
    return message


def verdict(kind: str, lang: str | None = None, **values: str) -> str:
    """One of ``check``'s own lines (``correct``, ``wrong``, ``reference``) in ``lang``."""
    lang = lang or language()
    english = {
        "correct": "✓ {name}: correct",
        "wrong": "✗ {name}: {message}",
        "reference": (
            "… {name}: not attempted yet — the reference solution passes this check. "
            "Replace the NotImplementedError with your code and run the cell again."
        ),
    }
    return VERDICTS.get(lang, english).get(kind, english[kind]).format(**values)
