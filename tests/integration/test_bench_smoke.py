"""The benchmark harness must not rot: its ferry-only side runs end to end at tiny size.

Runs ``bench/run.py`` as ``make bench`` would (a real subprocess, real runners, real pack and
loader), without the peers, and checks the results file and the generated page.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_bench_ferry_side_runs_and_writes_results(tmp_path: Path) -> None:
    page = tmp_path / "BENCHMARKS.md"
    cmd = [
        sys.executable,
        str(REPO / "bench" / "run.py"),
        "--quick",
        "--no-peers",
        "--no-profile",
        "--only",
        "pack,load,scaling",
        "--tokens",
        "300000",
        "--scaling",
        "1000",
        "--data",
        str(tmp_path / "data"),
        "--results",
        str(tmp_path / "results"),
        "--docs",
        str(page),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "results" / "latest.json").read_text())
    assert res["meta"]["corpus"]["tokens"] == 300_000
    assert res["meta"]["machine"]["cores"] >= 1

    pack = res["pack"]["cases"][0]["runs"]
    assert [r.get("error") for r in pack["ferry"]] == [None]
    assert pack["ferry"][0]["tokens_per_s"] > 0 and pack["ferry"][0]["output_bytes"] > 0
    assert pack["zstd-limit"][0]["output_bytes"] > 0

    load = res["load"]["throughput"]["0"]["runs"]
    assert load["ferry"][0]["tokens_per_s"] > 0, load["ferry"]
    assert load["memmap-limit"][0]["tokens_per_s"] > 0
    epochs = res["load"]["epoch"]["0"]["runs"]
    assert epochs["unzstd-limit"][0]["tokens_per_s"] > 0, epochs["unzstd-limit"]
    # the zstd limit's chunks are made untimed: its first timed epoch would otherwise include compressing them
    made, timed = proc.stderr.find("unzstd-limit input chunks made"), proc.stderr.find("epoch w0 unzstd-limit #1")
    assert 0 <= made < timed, proc.stderr[-2000:]
    resume = res["load"]["resume"]["runs"]["ferry"][0]
    assert resume["equal"] is True, "ferry's resumed batches differ from the uninterrupted run"

    scaling = res["scaling"]["sizes"][0]
    assert scaling["shards"] == 1000 and scaling["startup"][0]["startup_s"] > 0

    text = page.read_text()
    for heading in ("## Machine and versions", "## Pack", "## Load", "### Resume at 90%", "## Start-up and resume"):
        assert heading in text
    assert "failed" not in text.lower()
