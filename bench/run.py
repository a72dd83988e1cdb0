"""``make bench``: ferry side by side with litdata, MosaicML streaming, rclone and simple limits.

    .venv/bin/python bench/run.py                 # full run: 50M tokens, 3 repeats
    .venv/bin/python bench/run.py --quick         # smoke run: 2M tokens, 1 repeat
    .venv/bin/python bench/run.py --tokens 200000000 --only pack,load

Writes ``bench/results/<timestamp>.json`` and ``latest.json`` and regenerates ``docs/BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import envs  # noqa: E402
import report  # noqa: E402
from corpus import CorpusSpec, ensure_corpus  # noqa: E402
from harness import Context, log  # noqa: E402

SUITES = [
    "pack",
    "load",
    "scaling",
    "sync",
    "service",
    "schedule",
    "split",
    "seek",
    "remote",
    "ray_sync",
    "staging",
    "media",
    "fleet_sim",
    "swarm",
    "scale",
]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=None, help="corpus size in tokens (default 50M; --quick 2M)")
    p.add_argument(
        "--file-tokens",
        type=int,
        default=None,
        help="tokens per corpus input file (default 8M: ferry's shards ~14 MiB, one input file each; "
        "33.4M gives ~64 MiB shards like the peers')",
    )
    p.add_argument("--quick", action="store_true", help="small smoke run: fewer cases, 1 repeat")
    p.add_argument("--repeats", type=int, default=None, help="repeats per measurement (default 3; --quick 1)")
    p.add_argument("--only", default=",".join(SUITES), help=f"comma list of suites ({','.join(SUITES)})")
    p.add_argument("--no-peers", action="store_true", help="ferry and the limits only (no .venv-bench, no rclone)")
    p.add_argument("--sync-mib", type=int, default=None, help="size of the sync data set in MiB (default 1024)")
    p.add_argument("--scaling", default=None, help="comma list of shard counts (default 1000,10000,100000)")
    p.add_argument("--no-profile", action="store_true", help="skip profiling ferry where it misses a target")
    p.add_argument("--report-from", default=None, help="only regenerate the page from this results JSON")
    p.add_argument(
        "--merge",
        nargs="+",
        default=[],
        metavar="RESULTS",
        help="with --report-from: take these runs' suites over its own, save the merged results beside them "
        "and render those (the page names the run each suite comes from)",
    )
    p.add_argument("--data", default=None, help="scratch directory (default bench/data)")
    p.add_argument("--results", default=None, help="results directory (default bench/results)")
    p.add_argument("--docs", default=None, help="page to generate (default docs/BENCHMARKS.md); 'none' to skip")
    return p.parse_args(argv)


def _provenance(name: str, res: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Where each suite of results ``name`` was measured: that run, or for merged results the run their
    ``meta.merged`` names for it."""
    m = res["meta"]
    own = {"from": name, **{k: m.get(k) for k in ("command", "commit", "started", "machine")}}
    by_suite = {s.strip(): run for suites, run in (m.get("merged") or {}).items() for s in suites.split(",")}
    return {s: by_suite.get(s, own) for s in res if s != "meta"}


def merge_runs(base: dict[str, Any], base_name: str, others: list[Path]) -> dict[str, Any]:
    """``base`` with each of ``others``' suites taken over it; ``meta.merged`` names the run of every suite (a
    merged base keeps the runs it names)."""
    runs = [(base_name, base), *((p.name, json.loads(p.read_text())) for p in others)]
    out: dict[str, Any] = {"meta": dict(base["meta"])}
    source: dict[str, dict[str, Any]] = {}
    for name, res in runs:  # the last run with a suite wins
        out.update({s: v for s, v in res.items() if s != "meta"})
        source.update(_provenance(name, res))
    groups: dict[str, list[str]] = {}  # the suites of each run (by its results file), in name order
    for suite in sorted(source):
        groups.setdefault(source[suite]["from"], []).append(suite)
    out["meta"]["merged"] = {", ".join(suites): source[suites[0]] for suites in groups.values()}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out["meta"]["results_file"] = f"{stamp}-merged.json"
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    started = time.perf_counter()
    repo = Path(__file__).resolve().parent.parent
    if args.report_from:  # regenerate the page (e.g. after editing bench/analysis.md) without measuring
        src = Path(args.report_from).resolve()
        saved = json.loads(src.read_text())
        if args.merge:
            saved = merge_runs(saved, src.name, [Path(m).resolve() for m in args.merge])
            src = src.parent / saved["meta"]["results_file"]
            src.write_text(json.dumps(saved, indent=1, sort_keys=True, default=str))
            log(f"merged results: {src}")
        page = Path(args.docs) if args.docs else repo / "docs" / "BENCHMARKS.md"
        peers_py = repo / ".venv-bench" / "bin" / "python"
        stamped = saved["meta"].get("results_file", src.name)
        report.write(
            saved,
            page,
            str(peers_py) if peers_py.exists() else None,
            os.path.relpath(src.parent / stamped, page.parent.resolve()),
        )
        print(report.headline(saved))
        return 0
    suites = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(suites) - set(SUITES)
    if unknown:
        print(f"unknown suite(s): {', '.join(sorted(unknown))}; choose from {', '.join(SUITES)}", file=sys.stderr)
        return 2
    data = Path(args.data) if args.data else repo / "bench" / "data"
    data.mkdir(parents=True, exist_ok=True)
    venv = None if args.no_peers else envs.PeersVenv(repo)  # installs in the background
    rclone = None if args.no_peers or "sync" not in suites else envs.ensure_rclone()
    ctx = Context(
        repo=repo,
        data=data,
        ferry_python=sys.executable,
        peers_python=None,
        repeats=args.repeats or (1 if args.quick else 3),
        quick=args.quick,
        profile=not args.no_profile,
    )
    tokens = args.tokens or (2_000_000 if args.quick else 50_000_000)
    log(f"corpus: {tokens / 1e6:.0f}M tokens")
    t0 = time.perf_counter()
    spec = CorpusSpec(tokens, tokens_per_file=args.file_tokens) if args.file_tokens else CorpusSpec(tokens)
    ctx.corpus = ensure_corpus(data, spec)
    corpus_s = time.perf_counter() - t0
    sync_mib = args.sync_mib or (64 if args.quick else 1024)
    if "sync" in suites:  # its data set too, while pip may still be unpacking
        import suite_sync

        suite_sync.prepare(ctx, sync_mib)
    peers = venv.wait() if venv else None
    ctx.peers_python = peers
    results: dict[str, Any] = {
        "meta": {
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "command": " ".join(["bench/run.py", *(argv if argv is not None else sys.argv[1:])]),
            "commit": envs.commit(repo),
            "quick": args.quick,
            "repeats": ctx.repeats,
            "machine": envs.machine(),
            "versions": envs.versions(ctx.ferry_python, peers, rclone),
            "corpus": {
                **{k: v for k, v in ctx.corpus.to_dict().items() if k not in ("files", "root")},
                "files": len(ctx.corpus.files),
                "generate_s": corpus_s,
            },
            "peers": bool(peers),
        }
    }
    for name in suites:
        log(f"=== {name} ===")
        t0 = time.perf_counter()
        try:
            module = __import__(f"suite_{name}")
            kwargs: dict[str, Any] = {}
            if name == "sync":
                kwargs = {"rclone": rclone, "mib": sync_mib}
            if name == "scaling" and args.scaling:
                kwargs = {"sizes": [int(x) for x in args.scaling.split(",")]}
            results[name] = module.run(ctx, **kwargs)
        except Exception as exc:  # one broken suite must not lose the others' numbers
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        results[name]["suite_s"] = time.perf_counter() - t0
    results["meta"]["duration_s"] = time.perf_counter() - started
    out_dir = Path(args.results) if args.results else repo / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    results["meta"]["results_file"] = f"{stamp}.json"
    text = json.dumps(results, indent=1, sort_keys=True, default=str)
    (out_dir / f"{stamp}.json").write_text(text)
    (out_dir / "latest.json").write_text(text)
    log(f"results: {out_dir / (stamp + '.json')}")
    if args.docs != "none":
        page = Path(args.docs) if args.docs else repo / "docs" / "BENCHMARKS.md"
        report.write(
            results, page, peers, os.path.relpath((out_dir / f"{stamp}.json").resolve(), page.parent.resolve())
        )
        log(f"page: {page}")
    print(report.headline(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
