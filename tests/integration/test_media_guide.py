"""The multimodal guide's complete example runs as it is and prints what it says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("webdataset", reason="the test extra installs `webdataset`")
pytest.importorskip("PIL", reason="the media extra installs Pillow")
pytest.importorskip("torch", reason="the loader extra installs torch")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "multimodal.md"


def test_the_complete_example_runs(tmp_path: Path) -> None:
    text = GUIDE.read_text(encoding="utf-8").split("## A complete example", 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    script = tmp_path / "example.py"
    script.write_text(code.group(1), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.startswith("20 images,")
    assert re.search(r"row 0: a 40x\d+ png at \d+, \d+ tokens", run.stdout), run.stdout
