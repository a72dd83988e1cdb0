"""``make demo`` in a shortened form: the real script, as a process, exiting by itself (``--no-wait``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

DEMO = Path(__file__).resolve().parents[2] / "tools" / "demo.py"  # not shipped in the wheel: a repository tool


@pytest.mark.slow
def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    data = tmp_path / "demo-data"
    out = subprocess.run(
        [sys.executable, str(DEMO), "--data", str(data), "--port", "0", "--tokens", "1500000",
         "--shard-size", "131072", "--bwlimit", "4MiB/s", "--steps", "6", "--no-wait", "--timeout", "60"],
        capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "[demo] dashboard: http://127.0.0.1:" in text
    assert "west replica published" in text
    assert "steps 3..5 identical to the uninterrupted run" in text
    assert "published a second version at east" in text and "[demo] done in" in text
    # both versions ended up at west, and the token stayed in its 0600 file, not on screen
    token = (data / "api-token").read_text().strip()
    assert oct((data / "api-token").stat().st_mode & 0o777) == "0o600"
    assert token not in text and token not in out.stderr
    assert len(list((data / "west" / "demo-corpus" / "versions").iterdir())) == 2
