"""Docstrings and comments say what the code does and why, timelessly: no measured timings or counts of
runs (those go in docs/ pages) and no history (that goes in commit messages).

The patterns are narrow on purpose: each matches a phrasing that reports a measurement or a change,
rarely a description of what the code does."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("shard_tools", "client", "service", "tests", "bench", "tools", "examples")

_SECONDS = r"\d+(?:\.\d+)?\s?(?:ms|µs|us|s|sec|seconds|min|minutes)\b"
# name -> pattern; each names what it catches in the failure message
PATTERNS: dict[str, re.Pattern[str]] = {
    "history: 'used to'": re.compile(
        r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )(?<!\bwas )(?<!\bwere )"
        r"\bused to (?:be|fail|hang|crash|break|leak|deadlock|lose|miss|skip|ignore|end|stall)\b",
        re.IGNORECASE,
    ),
    "history: the fix": re.compile(r"\b(?:before|after|until|since) the fix\b", re.IGNORECASE),
    "history: 'previously'/'formerly'": re.compile(r"(?:^|[.;:(]\s*)(?:Previously|Formerly)\b"),
    "history: no longer": re.compile(r"\bno longer (?:fails|hangs|crashes|leaks|deadlocks|flakes)\b", re.IGNORECASE),
    "a count of runs": re.compile(
        r"\b\d+ (?:of|out of|in) \d+ (?:runs|tries|attempts|trials|iterations)\b|\bfails? \d+ of \d+\b",
        re.IGNORECASE,
    ),
    "a measured ratio": re.compile(r"\bwas (?:~|about |around )?\d+(?:\.\d+)?\s?[x×](?!\w)", re.IGNORECASE),
    "a measured time": re.compile(rf"\b(?:took|takes|taking) (?:~|about |around |roughly )?{_SECONDS}", re.IGNORECASE),
    "an approximate time": re.compile(rf"~\s?{_SECONDS}"),
    "a before/after time": re.compile(rf"\b{_SECONDS}\s+instead of\s+{_SECONDS}"),
    "an observation": re.compile(r"\bseen: |\bseen (?:once|twice|\d+ times)\b|\bmeasured here\b|\bon this VM\b"),
    "a machine's speed": re.compile(r"\bon (?:two|2) (?:busy|loaded) cores\b", re.IGNORECASE),
}


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring line of ``source``."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string.lstrip("#").strip()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                for offset, line in enumerate(doc.splitlines()):
                    yield first + offset, line


def findings(source: str) -> list[tuple[int, str, str]]:
    """(line, pattern name, text) for each docstring or comment line of ``source`` that a pattern matches."""
    return [
        (line, name, text.strip())
        for line, text in prose(source)
        for name, pattern in PATTERNS.items()
        if pattern.search(text)
    ]


def _python_files() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_no_measurements_or_history_in_docstrings_and_comments() -> None:
    files = _python_files()
    assert len(files) > 100, "the sweep found too few files: the folders moved?"
    found = [
        f"{path.relative_to(ROOT)}:{line}: {name}: {text}"
        for path in files
        for line, name, text in findings(path.read_text(encoding="utf-8"))
    ]
    assert not found, "say what the code does and why; numbers go in docs/, history in commits:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "text",
    [
        "a loop used to end silently",
        "before the fix it hung",
        "Previously, the cache kept every shard.",
        "it no longer hangs",
        "the loop ended silently in 4 of 30 runs",
        "the test fails 4 of 4 with every pack in one second",
        "the copy was 1.325x the baseline",
        "the pack took 12 s",
        "about ~20 s at 1M shards",
        "a cold first batch 0.02 s instead of 0.10 s",
        "(seen: two stalls)",
        "Azurite is slow on two busy cores",
    ],
)
def test_each_phrase_of_a_measurement_or_of_history_is_found(text: str) -> None:
    assert findings(f"x = 1  # {text}\n"), text
    assert findings(f'def f() -> None:\n    """{text}"""\n'), text


@pytest.mark.parametrize(
    "text",
    [
        "the key used to sign the request",
        "a timeout of 60 s",
        "every 2 s, at most",
        "the previously published version",
        "4 of 8 shards are cached",
        "a shard is written once",
        "4x smaller than int64",
        "files no longer referenced by any version",
    ],
)
def test_descriptions_of_what_the_code_does_pass(text: str) -> None:
    assert not findings(f"x = 1  # {text}\n"), text
    assert not findings(f'def f() -> None:\n    """{text}"""\n'), text


def test_only_docstrings_and_comments_are_read() -> None:
    source = 'LABEL = "took 12 s"\n\n\ndef f() -> str:\n    """Say it."""\n    return "used to fail"\n'
    assert findings(source) == []
