"""Charts for docs/BENCHMARKS.md (run in the peers' venv, which has matplotlib).

python bench/charts.py RESULTS.json IMG_DIR
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLORS = {"ferry": "#1f77b4", "litdata": "#ff7f0e", "mosaic": "#2ca02c", "memmap-limit": "#7f7f7f"}


def _median(runs: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in runs if key in r and "error" not in r]
    return statistics.median(vals) if vals else None


def load_chart(res: dict[str, Any], out: Path) -> None:
    cases = (res.get("load") or {}).get("throughput") or {}
    if not cases:
        return
    tools = ["ferry", "litdata", "mosaic", "memmap-limit"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    width = 0.2
    for i, tool in enumerate(tools):
        xs, ys = [], []
        for j, (_w, case) in enumerate(sorted(cases.items())):
            v = _median(case["runs"].get(tool, []), "tokens_per_s")
            if v:
                xs.append(j + (i - 1.5) * width)
                ys.append(v / 1e6)
        if xs:
            bars = ax.bar(xs, ys, width, label=tool, color=COLORS[tool])
            ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(range(len(cases)), [f"{w} workers" for w in sorted(cases)])
    ax.set_ylabel("Mtokens/s to the training loop")
    ax.set_yscale("log")
    ax.set_title("Loader throughput, batch 16x2049, shuffled (log scale)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench-load.png", dpi=110)
    plt.close(fig)


def scaling_chart(res: dict[str, Any], out: Path) -> None:
    rows = (res.get("scaling") or {}).get("sizes") or []
    if not rows:
        return
    fig, ax = plt.subplots(figsize=(7, 3.6))
    xs = [r["shards"] for r in rows]
    for key, runs_key, label in (
        ("startup_s", "startup", "start-up -> first batch"),
        ("resume_s", "resume", "resume at 90% -> first batch"),
    ):
        ys = [_median(r.get(runs_key, []), key) for r in rows]
        pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("shards in the manifest")
    ax.set_ylabel("seconds")
    ax.set_ylim(bottom=0)
    ax.set_title("ferry loader start-up vs dataset size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "bench-scaling.png", dpi=110)
    plt.close(fig)


def main() -> None:
    res = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    load_chart(res, out)
    scaling_chart(res, out)


if __name__ == "__main__":
    main()
