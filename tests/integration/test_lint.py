"""The code is ruff- and mypy-clean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_clean() -> None:
    ruff = BIN / "ruff"
    if not ruff.exists():
        pytest.skip("ruff is not installed in this environment (pip install 'ferry-data[test]')")
    result = _run(str(ruff), "check", "shard_tools", "client", "service", "tests", "bench", "tools", "examples")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_mypy_clean() -> None:
    result = _run(sys.executable, str(ROOT / "tools" / "typecheck.py"))
    assert result.returncode == 0, result.stdout + result.stderr
