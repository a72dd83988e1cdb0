"""The documentation: README.md stays a front page whose links into docs/ exist, and the mkdocs site builds
with ``--strict`` (every internal link and anchor resolves; the CLI, HTTP API and Python API pages are
generated from the code by tools/mkdocs_hooks.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
LINK = re.compile(r"\]\(([^)\s]+)\)")


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_is_a_front_page_of_at_most_300_lines() -> None:
    lines = readme().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; the manual belongs in docs/ (at most 300 here)"


def test_every_relative_link_of_the_readme_exists() -> None:
    targets = [t for t in LINK.findall(readme()) if not re.match(r"[a-z]+:|#", t)]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert pages
    assert [p for p in pages if f": {p}" not in nav] == []


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["NO_MKDOCS_2_WARNING"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stderr[-6000:]}"
    home = (site / "index.html").read_text(encoding="utf-8")
    assert "Quickstart" in home  # the home page is README.md
    cli = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    for command in ("pack", "sync", "serve", "status", "lease", "state", "trace"):
        assert f'id="ferry-{command}"' in cli, f"the CLI reference lacks `ferry {command}`"
    http = (site / "reference" / "http-api" / "index.html").read_text(encoding="utf-8")
    assert "/api/v1/replicas" in http and "/healthz" in http
    api = (site / "reference" / "python-api" / "index.html").read_text(encoding="utf-8")
    for name in ("ferry.shard_tools.pack", "ferry.client.TokenLoader", "ferry.service.Daemon"):
        assert f'id="{name}"' in api, f"the Python API page lacks {name}"
