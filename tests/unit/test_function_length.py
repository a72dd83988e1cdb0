"""No function or method in shard_tools/, client/, service/ is longer than 80 lines.

Run as a script to print the longest five: ``python tests/unit/test_function_length.py [N]``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shard_tools", "client", "service")
LIMIT = 80


def function_lengths(root: Path = ROOT) -> list[tuple[int, str]]:
    """(lines from ``def`` to the last line of the body, "path:line qualified.name") of every function,
    longest first; a nested function counts on its own and inside its parent."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert child.end_lineno is not None
                name = f"{prefix}{child.name}"
                found.append((child.end_lineno - child.lineno + 1, f"{path}:{child.lineno} {name}"))
                visit(child, path, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for package in PACKAGES:
        for file in sorted((root / package).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            visit(ast.parse(file.read_text(encoding="utf-8"), rel), rel, "")
    return sorted(found, key=lambda item: (-item[0], item[1]))


def test_function_lengths_finds_functions_methods_and_nested_ones(tmp_path: Path) -> None:
    pkg = tmp_path / "client"
    pkg.mkdir()
    body = "\n".join(f"        x{i} = {i}" for i in range(81))
    (pkg / "m.py").write_text(f"class A:\n    def long(self):\n{body}\n        def inner():\n            pass\n")
    (tmp_path / "shard_tools").mkdir()
    (tmp_path / "service").mkdir()
    assert function_lengths(tmp_path) == [(84, "client/m.py:2 A.long"), (2, "client/m.py:84 A.long.inner")]


def test_no_function_is_longer_than_80_lines() -> None:
    offenders = [f"{n} lines: {where}" for n, where in function_lengths() if n > LIMIT]
    assert not offenders, f"{len(offenders)} functions longer than {LIMIT} lines (split them):\n" + "\n".join(offenders)


if __name__ == "__main__":
    for n, where in function_lengths()[: int(sys.argv[1]) if len(sys.argv) > 1 else 5]:
        print(f"{n:5d}  {where}")
