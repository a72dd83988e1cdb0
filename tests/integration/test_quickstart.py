"""The README's quickstart, run as written: its code blocks, verbatim, in an empty directory.

The quickstart asks for an environment with ferry (the venv running these tests: its bin/ goes first on
PATH, as ``source .venv/bin/activate`` does) and ``FERRY_REPO`` set to the checkout; everything else is in
its blocks. A ``bash`` block runs under ``bash -euo pipefail``; a ``python`` block is saved as the
``train.py`` it says to save it as and run with ``python train.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = "## Quickstart"

pytestmark = pytest.mark.slow


def quickstart_blocks(readme: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block in the README's quickstart section, in order."""
    start = readme.index(QUICKSTART)
    end = readme.find("\n## ", start + len(QUICKSTART))
    section = readme[start : end if end != -1 else len(readme)]
    return re.findall(r"^```(\w+)\n(.*?)^```", section, re.S | re.M)


def run_block(language: str, code: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if language == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", code]
    elif language == "python":
        (cwd / "train.py").write_text(code)
        cmd = ["python", "train.py"]
    else:
        raise AssertionError(f"README.md's quickstart has a {language!r} block the test cannot run")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_quickstart_runs_verbatim_and_makes_the_dataset(tmp_path: Path) -> None:
    blocks = quickstart_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert [lang for lang, _ in blocks] == ["bash", "python"], blocks
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "FERRY_CACHE_DIR")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", FERRY_REPO=str(ROOT))
    env["HOME"] = str(tmp_path / "home")  # nothing lands in the real home directory
    work = tmp_path / "work"
    work.mkdir()
    outputs = []
    for language, code in blocks:
        proc = run_block(language, code, work, env)
        assert proc.returncode == 0, (
            f"README quickstart {language} block exit {proc.returncode}:\n{code}\n{proc.stderr[-4000:]}"
        )
        outputs.append(proc.stdout)
    east, west = (json.loads((work / "clusters" / c / "web" / "manifest.json").read_text()) for c in ("east", "west"))
    assert west["version_id"] == east["version_id"]
    assert east["totals"]["documents"] == 2000
    assert "resumed at step 5 with the same batches" in outputs[-1]
