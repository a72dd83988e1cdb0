"""Benchmark ratios: ferry's median against a peer's median, and against a limit's fastest run."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import harness  # noqa: E402


def _runs(*rates: float) -> list[dict[str, float]]:
    return [{"tokens_per_s": r} for r in rates]


def test_a_limit_counts_at_its_fastest_run_and_a_peer_at_its_median() -> None:
    runs = {"ferry": _runs(200, 225, 228), "litdata": _runs(110, 112, 115), "unzstd-limit": _runs(150, 229, 328)}
    out = harness.ratios(runs, "unzstd-limit")
    assert out["fraction_of_limit"] == 225 / 328  # a median (229) would have flattered ferry: 0.98
    assert out["ratio_vs"]["litdata"] == 225 / 112 and out["faster_peer"] == "litdata"
    assert harness.limit_rate("litdata", runs["litdata"]) == 112
    assert harness.limit_rate("unzstd-limit", []) is None
    assert "fraction_of_limit" not in harness.ratios({"ferry": _runs(1.0)}, "unzstd-limit")
