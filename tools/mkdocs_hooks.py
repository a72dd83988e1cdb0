"""mkdocs hooks for the documentation site (``hooks:`` in mkdocs.yml); none of this ships in the wheel.

- The site's home page is README.md itself, its links into ``docs/`` made relative to the site.
- ``<!-- ferry:cli -->`` becomes every ``ferry`` command's ``--help``, from the argparse parser.
- ``<!-- ferry:http-api -->`` becomes a table of the service's endpoints, from the FastAPI app's OpenAPI schema.
- ``<!-- ferry:python-api -->`` becomes a mkdocstrings block per public name (``__all__``) of the three packages.
- A link that leaves ``docs/`` (a results file under ``bench/``) shows its text: the site holds only ``docs/``.
- mkdocstrings reads the packages through the link tree of ``tools/typecheck.py`` (``.mypy-tree/``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import posixpath
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ferry.shard_tools", "ferry.client", "ferry.service")
HELP_COLUMNS = "100"
_LINK = re.compile(r"(!?)\[([^\]\n]*)\]\(([^)\s]+)\)")


def _link_tree() -> None:
    """.mypy-tree/ferry/<package> -> <package>/, the path mkdocstrings searches. Made when mkdocs loads this
    module, while it reads mkdocs.yml: mkdocstrings' handler drops a search path that does not exist yet
    when its own on_config runs, which may be before this module's."""
    spec = importlib.util.spec_from_file_location("ferry_typecheck", ROOT / "tools" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.link_tree()


_link_tree()


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    text = _readme_for_site((ROOT / "README.md").read_text(encoding="utf-8"))
    files.append(File.generated(config, "index.md", content=text))
    return files


def _readme_for_site(text: str) -> str:
    """README.md's links as seen from the site's root: ``docs/X`` is ``X``; other repository paths are text."""

    def fix(m: re.Match[str]) -> str:
        bang, label, target = m.groups()
        if re.match(r"[a-z]+:|#", target):
            return m.group(0)
        if target.startswith("docs/"):
            return f"{bang}[{label}]({target[len('docs/') :]})"
        return label

    return _LINK.sub(fix, text)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    markdown = markdown.replace("<!-- ferry:cli -->", cli_markdown())
    markdown = markdown.replace("<!-- ferry:http-api -->", http_api_markdown())
    markdown = markdown.replace("<!-- ferry:python-api -->", python_api_markdown())
    return _links_outside_docs_as_text(markdown, page.file.src_uri)


def _links_outside_docs_as_text(markdown: str, src_uri: str) -> str:
    base = posixpath.dirname(src_uri)

    def fix(m: re.Match[str]) -> str:
        bang, label, target = m.groups()
        if bang or re.match(r"[a-z]+:|#", target):
            return m.group(0)
        if posixpath.normpath(posixpath.join(base, target.split("#")[0])).startswith("../"):
            return label
        return m.group(0)

    return _LINK.sub(fix, markdown)


def cli_markdown() -> str:
    """Every command's ``--help`` as the ``ferry`` command prints it (wrapped at 100 columns)."""
    from ferry.shard_tools.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        parts: list[str] = []
        _parser_markdown(build_parser(), 2, parts)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


def _parser_markdown(parser: argparse.ArgumentParser, level: int, parts: list[str]) -> None:
    parts.append(f"{'#' * level} `{parser.prog}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to one parser
                _parser_markdown(sub, min(level + 1, 4), parts)


class _SchemaOnlyBackend:
    """Just enough of a daemon for ``create_app`` to build its routes; nothing is ever served."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: lambda *args, **kwargs: None


def http_api_markdown() -> str:
    """One row per endpoint of the app ``ferry serve`` runs: method, path, summary, query and body."""
    from ferry.service.api.app import create_app

    schema = create_app(_SchemaOnlyBackend()).openapi()
    rows = ["| method | path | summary | query | body |", "|---|---|---|---|---|"]
    for path, operations in schema["paths"].items():
        for method, op in operations.items():
            query = ", ".join(f"`{p['name']}`" for p in op.get("parameters", []) if p.get("in") == "query")
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
            body_name = body.get("$ref", "").rsplit("/", 1)[-1]
            summary = (op.get("summary") or "").replace("|", "\\|")
            body_cell = f"`{body_name}`" if body_name else ""
            rows.append(f"| {method.upper()} | `{path}` | {summary} | {query} | {body_cell} |")
    return "\n".join(rows) + "\n"


def python_api_markdown() -> str:
    """A mkdocstrings block for every name in each package's ``__all__`` (the lazy names included)."""
    parts = []
    for package in PACKAGES:
        names = [n for n in importlib.import_module(package).__all__ if not n.startswith("_")]
        parts.append(f"## `{package}`\n")
        parts.extend(f"::: {package}.{name}\n" for name in names)
    return "\n".join(parts)
