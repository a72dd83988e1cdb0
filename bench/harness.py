"""Running runners: one subprocess per measurement, its JSON result parsed, failures recorded not fatal.

Every comparison goes through :func:`alternate`: repeat ``r`` runs every tool once, in an order
rotated by ``r``, so slow drift of the machine (other load, page cache, thermal) spreads over all
tools instead of landing on one.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Context", "Runner", "alternate", "summary", "log", "run_json"]

HERE = Path(__file__).resolve().parent
RUNNERS = HERE / "runners"


def log(msg: str) -> None:
    """Progress line on stderr (stdout stays clean)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class Context:
    """Where things are and how big the run is."""

    repo: Path
    data: Path  # scratch: corpus, outputs, caches
    ferry_python: str
    peers_python: str | None  # None: peers not available (--no-peers or setup failed)
    repeats: int
    quick: bool
    corpus: Any = None
    profile: bool = True  # profile ferry's hot path where it misses a target
    notes: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        # a user's Python caches bytecode; without it every run recompiles ferry's modules
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPATH"] = str(RUNNERS)
        env.setdefault("PYTHONWARNINGS", "ignore")
        return env


def run_json(cmd: Sequence[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run a command whose last stdout line is JSON (or whose whole stdout is one JSON document, indented); on
    failure return ``{"error": ...}``."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip().startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)[-400:]}
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        try:
            result = json.loads(proc.stdout)
        except json.JSONDecodeError:
            return {"error": f"bad JSON from runner: {exc}"}
    result["wall_s"] = wall
    return result


@dataclass(frozen=True)
class Runner:
    """One tool's runner script and the interpreter (venv) it runs in."""

    name: str
    script: str
    python: str
    env: tuple[tuple[str, str], ...] = ()  # set in the runner's environment, over the context's

    def environ(self, ctx: Context) -> dict[str, str]:
        return {**ctx.env(), **dict(self.env)}

    def __call__(self, ctx: Context, args: dict[str, Any], timeout: float = 900) -> dict[str, Any]:
        cmd = [self.python, str(RUNNERS / self.script), json.dumps(args)]
        res = run_json(cmd, self.environ(ctx), timeout)
        res.setdefault("load_1m", round(os.getloadavg()[0], 2))  # what else ran beside it: a page states it
        return res

    def profile(self, ctx: Context, args: dict[str, Any]) -> str:
        """Top functions of one run: py-spy over all threads where the peers' venv has it, else cProfile."""
        spy = Path(ctx.peers_python).parent / "py-spy" if ctx.peers_python else None
        if spy is not None and spy.exists():
            import pyspy

            cmd = [self.python, str(RUNNERS / self.script), json.dumps(args)]
            return "py-spy:\n" + pyspy.top(str(spy), cmd, self.environ(ctx), rate=1000, skip_imports=True)
        res = self(ctx, {**args, "profile": True})
        return "cProfile, main thread only:\n" + str(res.get("profile") or res.get("error", ""))


def alternate(
    ctx: Context,
    tools: Sequence[str],
    one: Callable[[str, int], dict[str, Any]],
    repeats: int | None = None,
    what: str = "",
) -> dict[str, list[dict[str, Any]]]:
    """``one(tool, repeat)`` for every tool, ``repeats`` times, order rotated per repeat."""
    n = repeats or ctx.repeats
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    for r in range(n):
        order = list(tools[r % len(tools) :]) + list(tools[: r % len(tools)])
        for tool in order:
            res = one(tool, r)
            runs[tool].append(res)
            status = res.get("error") or ", ".join(
                f"{k}={v:.3g}" for k, v in res.items() if isinstance(v, float) and k != "wall_s"
            )
            log(f"{what} {tool} #{r + 1}: {status[:160]}")
    return runs


def summary(runs: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    """Median and spread (min, max) of ``key`` over the successful runs, or None."""
    values = [float(r[key]) for r in runs if r.get(key) is not None and "error" not in r]
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def first_error(runs: list[dict[str, Any]]) -> str | None:
    """The first error among runs, for the report."""
    return next((str(r["error"]) for r in runs if "error" in r), None)


def limit_rate(tool: str, runs: list[dict[str, Any]]) -> float | None:
    """The tokens/s a tool is compared at: its median, or for a limit (``*-limit``) its fastest run. A limit is
    what the machine allows, so a run of it the machine slowed (a memory or page-cache stall) must not flatter
    ferry."""
    if not tool.endswith("-limit"):
        return (summary(runs, "tokens_per_s") or {}).get("median")
    return max((float(r["tokens_per_s"]) for r in runs if r.get("tokens_per_s")), default=None)


def of_limit(runs: dict[str, list[dict[str, Any]]], limit: str) -> float | None:
    """ferry's median tokens/s as a share of the ``limit`` tool's fastest run (None when either is missing)."""
    ferry = limit_rate("ferry", runs.get("ferry", []))
    bound = limit_rate(limit, runs.get(limit, []))
    return ferry / bound if ferry and bound else None


def ratios(runs: dict[str, list[dict[str, Any]]], limit: str) -> dict[str, Any]:
    """ferry's median tokens/s against each peer's median, the faster peer, and the ``limit`` tool's fastest run."""
    med = {t: (summary(r, "tokens_per_s") or {}).get("median") for t, r in runs.items()}
    ferry = med.get("ferry")
    peers = {t: v for t, v in med.items() if t in ("litdata", "mosaic") and v}
    out: dict[str, Any] = {"ratio_vs": {t: ferry / v for t, v in peers.items()} if ferry else {}}
    if ferry and peers:
        best = max(peers, key=lambda t: peers[t])
        out["faster_peer"] = best
        out["ratio_vs_faster_peer"] = ferry / peers[best]
    frac = of_limit(runs, limit)
    if frac:
        out["fraction_of_limit"] = frac
    return out
