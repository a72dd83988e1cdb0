"""The scale suite of ``make bench`` runs its scripts end to end at small size and renders every part."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_scale_suite_measures_every_part_and_renders_it(tmp_path: Path) -> None:
    page = tmp_path / "BENCHMARKS.md"
    cmd = [sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--no-peers", "--only", "scale",
           "--tokens", "100000", "--data", str(tmp_path / "data"), "--results", str(tmp_path / "results"),
           "--docs", str(page)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads((tmp_path / "results" / "latest.json").read_text())
    scale = res["scale"]
    assert [p for p in ("manifest", "daemon", "engine_steps", "ranks", "http") if "error" in scale[p]] == []
    assert [r["shards"] for r in scale["manifest"]["results"]] == [1_000, 10_000]
    assert all(r["load_manifest_s"] > 0 and r["loader"]["global"]["start_up_s"] > 0
               for r in scale["manifest"]["results"])  # fmt: skip
    (version,) = scale["new_version"]  # one repeat in a quick run
    assert version["new_version"][0]["new_shards"] == 100 and version["new_version"][0]["start_to_planned_s"] > 0
    assert scale["engine_steps"]["engine_steps"][0]["copies"] == 100
    rows = {(r["ranks"], r["mode"]): r for r in scale["ranks"]["rows"]}
    assert rows[4, "no cache"]["table_requests"] == 4 and rows[4, "node cache, cold"]["table_requests"] == 1
    assert rows[4, "node cache, warm"]["table_requests"] == 0
    assert set(scale["http"]["puts"]) == {"65536", "8388608"}
    if (REPO / ".git").exists():
        assert res["meta"]["commit"], "the run records the commit it measured"

    text = page.read_text()
    section = text[text.index("## Scale: up to 1M shards") :]
    for heading in ("### The manifest and a rank's start-up", "### A daemon planning", "### Job start-up on one node",
                    "### ferry's own HTTP pieces"):  # fmt: skip
        assert heading in section
    assert "| 10,000 |" in section and "| 4 | node cache, cold |" in section
    assert "Goal for a new version: planned within 2 s" in section
    assert "error" not in section.lower() and "not run" not in section
