"""``docs/BENCHMARKS.md`` from a results dict: machine, versions, method, tables, ratios, charts, gaps."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import first_error, limit_rate, of_limit, summary

__all__ = ["write", "headline"]

HERE = Path(__file__).resolve().parent
PEERS = ("litdata", "mosaic")
LABEL = {
    "ferry": "ferry",
    "ferry-separate": "ferry, separate input_ids/labels (its default)",
    "litdata": "litdata 0.2.76",
    "mosaic": "MosaicML streaming 0.13.0",
    "zstd-limit": "limit: Parquet read + zstd only",
    "memmap-limit": "limit: numpy.memmap gather",
    "unzstd-limit": "limit: zstd decompress + gather",
    "rclone": "rclone sync --checksum",
    "cp": "limit: cp -r",
    "put-limit": "limit: bare presigned PUTs",
}


def _m(x: float | None, scale: float = 1e6, digits: int = 1) -> str:
    return "—" if x is None else f"{x / scale:.{digits}f}"


def _cell(runs: list[dict[str, Any]], key: str, scale: float = 1e6, digits: int = 1) -> str:
    s = summary(runs, key)
    if s is None:
        err = first_error(runs)
        return f"failed: {' '.join(err.replace('|', ' ').split())[:80]}" if err else "—"
    if s["n"] == 1:
        return _m(s["median"], scale, digits)
    return f"{_m(s['median'], scale, digits)} ({_m(s['min'], scale, digits)}–{_m(s['max'], scale, digits)})"


def _med(runs: list[dict[str, Any]], key: str) -> float | None:
    s = summary(runs, key)
    return None if s is None else s["median"]


def _ratio(a: float | None, b: float | None) -> str:
    return "—" if not a or not b else f"{a / b:.2f}x"


def _verdict(value: float | None, target: float, what: str) -> str:
    if value is None:
        return f"{what}: not measured"
    ok = "met" if value >= target else "**not met**"
    return f"{what}: {value:.2f} (target ≥ {target:g}) — {ok}"


# Peers read rank/world size from torch.distributed / launcher env vars only, so a world-size change
# needs a multi-process launch; this suite does not run one for them.
WORLD_NOTE = {
    "litdata": "not measured (world size comes from torch.distributed; needs a multi-process launch)",
    "mosaic": "not measured (world size comes from launcher env vars; needs a multi-process launch)",
}

# ---------------------------------------------------------------- sections


def _machine(res: dict[str, Any]) -> list[str]:
    meta = res["meta"]
    m = meta["machine"]
    v = meta.get("versions", {})
    lines = [
        "## Machine and versions",
        "",
        f"- CPU: {m.get('cpu_model')} — {m.get('cores')} cores, {m.get('ram_gib')} GiB RAM; {m.get('os')}; "
        f"Python {m.get('python')}",
    ]
    for venv, pkgs in v.items():
        if isinstance(pkgs, dict):
            lines.append(f"- `{venv}`: " + ", ".join(f"{k} {pv}" for k, pv in sorted(pkgs.items())))
        else:
            lines.append(f"- {venv}: {pkgs}")
    c = meta.get("corpus", {})
    lines += [
        f"- Corpus: {c.get('tokens', 0) / 1e6:.0f}M tokens in {c.get('documents')} documents, {c.get('files')} Parquet "
        f"files (`tokens` list<uint16>), log-normal lengths (median ~600), Zipf ids, vocab 50257, seed "
        f"{c.get('spec', {}).get('seed')}; "
        + (f"generated in {c['generate_s']:.1f} s." if c.get("generate_s", 0) > 0.5 else "reused from bench/data."),
        f"- Run: `{meta.get('command')}`"
        + (f" at commit {meta['commit']}" if meta.get("commit") else "")
        + f", {meta.get('repeats')} repeats per measurement, started "
        f"{meta.get('started')}, took {meta.get('duration_s', 0) / 60:.1f} min.",
        *_merged(meta.get("merged") or {}),
        "",
    ]
    return lines


def _merged(merged: dict[str, Any]) -> list[str]:
    """Where each suite's numbers come from, when the results merge several runs."""
    if not merged:
        return []
    lines = ["- The results merge runs; each suite's numbers are those of one run (compare tools within a run):"]
    for suites, run in merged.items():
        started = f", started {run['started']}" if run.get("started") else ""
        m = run.get("machine") or {}
        on = f", on {m.get('cpu_model')} ({m.get('cores')} cores)" if m.get("cpu_model") else ""
        at = f" at commit {run['commit']}" if run.get("commit") else ""
        lines.append(f"  - {suites}: `{run.get('command')}`{at} (`{run.get('from')}`{started}{on})")
    return lines


METHOD = """## Method

- {runs} Each tool runs in its own process
  (ferry in `.venv`; litdata and MosaicML in `.venv-bench`, with torch 2.14.1 + torchvision 0.29.1 because
  MosaicML imports torchvision). Times are taken inside that process after its imports.
- Repeats alternate the tools (repeat *r* rotates the order by *r*), so drift on this shared 2-core machine
  spreads over every tool. Cells show **median (min–max)** over the repeats. In the Pack and Load
  tables *ferry ÷ tool* divides ferry's median by a peer's median, and by a limit's fastest run: a limit is
  what the machine allows, so a run of it that the machine slowed does not flatter ferry.
- **Pack**: same Parquet input, EOS appended per document, ~64 MiB raw shards/chunks, zstd at the same
  level (1 = ferry's default, and 3), the same number of worker processes (1 and 2). litdata:
  `optimize(fn, inputs=files, item_loader=TokensLoader(), compression="zstd:L", compression_level="chunk",
  chunk_bytes=64MiB, num_workers=N)`. MosaicML: `MDSWriter(columns={"tokens": "ndarray:uint16"},
  compression="zstd:L", size_limit=64MiB)` over 2049-token samples (llm-foundry's concatenated layout);
  with 2 workers, one writer per process into a subdirectory, then `merge_index`. The limit reads the
  Parquet column and zstd-compresses its raw uint16 buffer, nothing else. tokens/s counts document tokens.
- **Load**: each tool reads its own zstd-1 output of that corpus from local disk. Batch 16 × 2049 tokens
  delivered as `input_ids`/`labels` int64 [16, 2048], two views of one widened [16, 2049] buffer for every tool
  (the peers' runners slice their batch so; ferry with `shared_labels=True`; the row *separate input_ids/labels*
  is ferry's default, two contiguous tensors, which writes twice the bytes), shuffle on (ferry
  `shuffle="global"`, litdata `shuffle=True`, MosaicML default `py1e`), 0 and 2 DataLoader workers. litdata
  reads `"local:" + path` with a separate `cache_dir` (it deletes compressed sources otherwise). The first run
  per tool uses an empty cache (*cold*); timed repeats reuse it (*warm*). Throughput is measured after the first
  batch for ≥ 3 s (or one epoch). The limit gathers random 2049-token windows from a `numpy.memmap` of the raw
  stream. Peak RSS is the runner process (+ largest worker). Every loader runner (ferry's, the peers', the
  limits') runs with `OMP_NUM_THREADS=1`: torch's intra-op threads only fight the loader for the cores. *Mtok
  per CPU s* divides the tokens delivered by the CPU time (user + system) the runner and its DataLoader workers
  spent over the same stretch (the runner's own in microseconds from `getrusage`, live workers' in 10 ms clock
  ticks from `/proc`). A *cold epoch* reads one whole epoch from an empty cache, timed from building the loader
  to its last batch, 7 times per tool in a full run (alternated, after `sync`: the files earlier runs wrote and
  removed are written out first); its limit decompresses zstd-1 chunks (64 MiB raw) of the raw stream into
  memory on one thread, then gathers the same windows as the memmap limit.
- **Resume**: an uninterrupted run stops at 90% of the epoch, saves the loader state (JSON) and digests
  the next 8 batches. Fresh processes build the loader, load the state and time until the first batch;
  *exact* means all 8 batches equal the uninterrupted run. The same state is also loaded into a loader
  with 2 workers.
- **Scaling**: synthetic datasets whose manifests list 1k…1M shards (every row points at one tiny real
  shard), published with `Manifest.build` + `publish_version`; start-up = construct + first batch,
  resume = construct + `load_state_dict` at 90% + first batch, each in a fresh process.
- **Sync**: a ferry dataset of real shards (~32 MiB each) copied local→local and local→S3 (moto server
  on 127.0.0.1 started by the bench) with `ferry sync --transfers 4` and `rclone sync --transfers 4
  --checksum` (AWS_CA_BUNDLE unset for rclone), `cp -r` as the local limit; then a no-op re-run. The S3
  limit (`bench/runners/s3_put_limit.py`) PUTs every file from 4 threads to presigned URLs with no hashing,
  verification or listing; its row's MB/s includes its process start like the others, and the ceiling
  uses its PUTs alone.
"""


def _method(res: dict[str, Any]) -> list[str]:
    """The method, which names the one run, or the runs, the page's numbers come from."""
    if res["meta"].get("merged"):
        runs = "The runs named above measure everything below, each suite in one run at the same code."
    else:
        runs = "One run of `make bench` (`bench/run.py`) measures everything below."
    return [METHOD.replace("{runs}", runs)]


def _pack(res: dict[str, Any]) -> list[str]:
    p = res.get("pack")
    if not p:
        return []
    if "error" in p:
        return ["## Pack", "", f"Suite failed: `{p['error']}`", ""]
    lines = [
        "## Pack (Parquet → zstd shards)",
        "",
        f"{p['tokens'] / 1e6:.0f}M tokens. Mtok/s = million document tokens per second, median (min–max).",
        "",
        "| zstd level | workers | tool | Mtok/s | output MB | ferry ÷ tool |",
        "|---|---|---|---|---|---|",
    ]
    for case in p["cases"]:
        ferry = _med(case["runs"].get("ferry", []), "tokens_per_s")
        for tool, runs in case["runs"].items():
            ratio = "" if tool == "ferry" else _ratio(ferry, limit_rate(tool, runs))
            out = _med(runs, "output_bytes")
            lines.append(
                f"| {case['level']} | {case['workers']} | {LABEL.get(tool, tool)} | {_cell(runs, 'tokens_per_s')} | "
                f"{_m(out, 1e6, 1)} | {ratio} |"
            )
    lines += ["", "Targets (ferry ≥ 3× the faster peer at the same settings; the limit shows what is left):", ""]
    for case in p["cases"]:
        ratio = case.get("ratio_vs_faster_peer")
        frac = of_limit(case["runs"], "zstd-limit")
        peer = LABEL.get(case.get("faster_peer", ""), "")
        lines.append(
            f"- zstd-{case['level']}, {case['workers']} worker(s): "
            + (_verdict(ratio, 3.0, f"ferry ÷ faster peer ({peer})") if ratio is not None else "peers not measured")
            + (f"; ferry reaches {frac:.0%} of the zstd-only limit" if frac else "")
            + _ceiling(case)
        )
    lines.append("")
    return lines


def _ceiling(case: dict[str, Any]) -> str:
    """How far ahead of the faster peer any packer could be: the zstd-only limit over that peer."""
    peer = case.get("faster_peer")
    limit = _med(case["runs"].get("zstd-limit", []), "tokens_per_s")
    best = _med(case["runs"].get(peer, []), "tokens_per_s") if peer else None
    if not limit or not best:
        return ""
    reach = "out of reach" if limit / best < 3 else "reachable"
    return f"; ceiling: limit ÷ faster peer = {limit / best:.2f}x, so 3× is {reach} at these settings"


def _load(res: dict[str, Any]) -> list[str]:
    ld = res.get("load")
    if not ld:
        return []
    if "error" in ld:
        return ["## Load", "", f"Suite failed: `{ld['error']}`", ""]
    lines = [
        "## Load (tokens delivered to the training loop)",
        "",
        "![loader throughput](img/bench-load.png)",
        "",
        "| workers | tool | Mtok/s (warm) | Mtok per CPU s | first batch, cold s | first batch, warm s | peak RSS MB "
        "| ferry ÷ tool |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w, case in ld["throughput"].items():
        ferry = _med(case["runs"].get("ferry", []), "tokens_per_s")
        for tool, runs in case["runs"].items():
            cold = case.get("cold", {}).get(tool, {})
            cold_s = f"{cold['first_batch_s']:.3f}" if "first_batch_s" in cold else cold.get("error", "—")[:60]
            rss = _med(runs, "peak_rss_mb")
            kids = _med(runs, "peak_rss_children_mb") or 0
            rss_s = "—" if rss is None else f"{rss:.0f}" + (f" (+{kids:.0f} worker)" if w != "0" and kids else "")
            ratio = "" if tool == "ferry" else _ratio(ferry, limit_rate(tool, runs))
            lines.append(
                f"| {w} | {LABEL.get(tool, tool)} | {_cell(runs, 'tokens_per_s')} | "
                f"{_cell(runs, 'tokens_per_cpu_s')} | {cold_s} | "
                f"{_cell(runs, 'first_batch_s', 1, 3)} | {rss_s} | {ratio} |"
            )
    lines += ["", "Targets (≥ 3× the faster peer, ≥ 50% of the memmap limit; ≥ 2× the best peer per CPU second):", ""]
    for w, case in ld["throughput"].items():
        r = case.get("ratio_vs_faster_peer")
        f = of_limit(case["runs"], "memmap-limit")
        parts = [f"- {w} workers: "]
        parts.append(
            _verdict(r, 3.0, f"ferry ÷ faster peer ({LABEL.get(case.get('faster_peer', ''), '')})")
            if r is not None
            else "peers not measured"
        )
        if f is not None:
            parts.append("; " + _verdict(f, 0.5, "ferry ÷ memmap limit"))
        lines.append("".join(parts))
    lines += _twice_the_peers(ld["throughput"], "warm cache")
    lines += ["", *_epoch(ld.get("epoch", {})), *_resume(ld.get("resume", {})), ""]
    return lines


def _twice_the_peers(cases: dict[str, Any], what: str) -> list[str]:
    """ferry ÷ the faster peer in tokens/s and, apart, ÷ the peer with the most tokens per CPU second: ≥ 2×."""
    lines = []
    for w, case in cases.items():
        runs = case["runs"]
        peers = [t for t in ("litdata", "mosaic") if t in runs]
        parts = []
        for key, label in (("tokens_per_s", "tokens/s"), ("tokens_per_cpu_s", "tokens per CPU s")):
            ferry = _med(runs.get("ferry", []), key)
            best = max((v for v in (_med(runs[t], key) for t in peers) if v), default=None)
            value = ferry / best if ferry and best else None
            parts.append(_verdict(value, 2.0, f"{label}, ferry ÷ best peer"))
        lines.append(f"- {what}, {w} workers: " + "; ".join(parts))
    return lines


def _epoch(ep: dict[str, Any]) -> list[str]:
    """The cold-epoch table: tokens/s and tokens per CPU second over a whole epoch from an empty cache."""
    if not ep:
        return []
    lines = [
        "### One cold epoch (empty cache, from building the loader to its last batch)",
        "",
        "| workers | tool | Mtok/s | Mtok per CPU s | first batch s | ferry ÷ tool |",
        "|---|---|---|---|---|---|",
    ]
    for w, case in ep.items():
        ferry = _med(case["runs"].get("ferry", []), "tokens_per_s")
        for tool, runs in case["runs"].items():
            ratio = "" if tool == "ferry" else _ratio(ferry, limit_rate(tool, runs))
            lines.append(
                f"| {w} | {LABEL.get(tool, tool)} | {_cell(runs, 'tokens_per_s')} | {_cell(runs, 'tokens_per_cpu_s')} "
                f"| {_cell(runs, 'first_batch_s', 1, 3)} | {ratio} |"
            )
    f = of_limit((ep.get("0") or {}).get("runs", {}), "unzstd-limit")
    lines += ["", "Targets (≥ 2× the best peer in tokens/s and in tokens per CPU second, ≥ 80% of the limit):", ""]
    lines += _twice_the_peers(ep, "cold epoch")
    lines += ["- " + _verdict(f, 0.8, "0 workers: ferry ÷ zstd decompress + gather limit, cold epoch"), ""]
    return lines


def _resume(rs: dict[str, Any]) -> list[str]:
    if not rs:
        return []
    refs = rs.get("reference", {})
    lines = [
        "### Resume at 90% of an epoch",
        "",
        "| tool | resume → first batch, s | next 8 batches equal the uninterrupted run | same state, 2 workers "
        "| same state, world size 1 → 2 |",
        "|---|---|---|---|---|",
    ]
    for tool, ref in refs.items():
        runs = rs.get("runs", {}).get(tool, [])
        if "error" in ref or "unsupported" in ref:
            lines.append(f"| {LABEL.get(tool, tool)} | {ref.get('error') or ref.get('unsupported')} | — | — | — |")
            continue
        eq = [r.get("equal") for r in runs if "equal" in r]
        exact = "yes" if eq and all(eq) else ("**no**" if eq else first_error(runs) or "—")
        el = rs.get("workers_0_to_2", {}).get(tool)
        if el is None:
            el_s = "—"
        elif "equal" in el:
            el_s = "yes" if el["equal"] else "**no** (different batches)"
        else:
            el_s = f"**cannot**: {str(el.get('error', ''))[:90]}"
        ws = rs.get("world_1_to_2", {}).get(tool)
        if ws is not None:
            ws_s = ("yes" if ws.get("equal") else "**no**") if "equal" in ws else f"failed: {ws.get('error', '')[:80]}"
        elif tool in PEERS:
            ws_s = WORLD_NOTE[tool]
        else:
            ws_s = "—"
        lines.append(f"| {LABEL.get(tool, tool)} | {_cell(runs, 'resume_s', 1, 3)} | {exact} | {el_s} | {ws_s} |")
    lines.append("")
    return lines


def _scaling(res: dict[str, Any]) -> list[str]:
    sc = res.get("scaling")
    if not sc:
        return []
    if "error" in sc:
        return ["## Scaling", "", f"Suite failed: `{sc['error']}`", ""]
    lines = [
        "## Start-up and resume vs dataset size (ferry)",
        "",
        "![start-up vs shards](img/bench-scaling.png)",
        "",
        "| shards | tokens | manifest + table bytes | build manifest s | start-up → first batch s | "
        "resume at 90% → first batch s |",
        "|---|---|---|---|---|---|",
    ]
    for row in sc.get("sizes", []):
        lines.append(
            f"| {row['shards']:,} | {row.get('tokens', 0):,} | {row.get('manifest_bytes', 0):,} | "
            f"{row.get('build_s', 0):.2f} | {_cell(row.get('startup', []), 'startup_s', 1, 3)} | "
            f"{_cell(row.get('resume', []), 'resume_s', 1, 3)} |"
        )
    if sc.get("note"):
        lines += ["", sc["note"]]
    lines.append("")
    return lines


def _sync(res: dict[str, Any]) -> list[str]:
    sy = res.get("sync")
    if not sy:
        return []
    if "error" in sy:
        return ["## Sync", "", f"Suite failed: `{sy['error']}`", ""]
    lines = [
        "## Sync (replication)",
        "",
        f"{sy.get('shards')} shards, {sy.get('bytes', 0) / 2**20:.0f} MiB, {sy.get('transfers')} transfers.",
        "",
        "| link | tool | MB/s | no-op re-run s | ferry ÷ tool (MB/s) | tool ÷ ferry (no-op time) |",
        "|---|---|---|---|---|---|",
    ]
    for link, case in _links(sy):
        ferry = case["runs"].get("ferry", [])
        f_mb = _med(ferry, "mb_per_s")
        f_noop = _med(ferry, "noop_s")
        for tool, runs in case["runs"].items():
            mb = _med(runs, "mb_per_s")
            noop = _med(runs, "noop_s")
            lines.append(
                f"| {link} | {LABEL.get(tool, tool)} | {_cell(runs, 'mb_per_s', 1, 0)} | "
                f"{_cell(runs, 'noop_s', 1, 3)} | {'' if tool == 'ferry' else _ratio(f_mb, mb)} | "
                f"{'' if tool == 'ferry' else _ratio(noop, f_noop)} |"
            )
    lines += ["", "Targets (≥ 1.5× rclone's MB/s, no-op ≥ 10× faster):", ""]
    for link, case in _links(sy):
        r = case.get("ratio_vs_rclone")
        n = case.get("noop_speedup_vs_rclone")
        line = f"- {link}: " + _verdict(r, 1.5, "throughput ÷ rclone") + "; " + _verdict(n, 10, "no-op speed-up")
        if case.get("put_ceiling_vs_rclone"):
            ceiling = case["put_ceiling_vs_rclone"]
            line += (
                f"; ferry reaches {case.get('fraction_of_put_limit', 0):.0%} of the bare-PUT limit; ceiling: the"
                f" limit's PUTs alone (no process start) ÷ rclone = {ceiling:.2f}x, so 1.5× is"
                f" {'out of reach' if ceiling < 1.5 else 'reachable'} against this server"
            )
        lines.append(line)
    if sy.get("note"):
        lines += ["", sy["note"]]
    lines.append("")
    return lines


def _links(sy: dict[str, Any]) -> list[tuple[str, Any]]:
    """Links in a stable order: local first (results JSON sorts keys)."""
    return sorted((sy.get("links") or {}).items(), key=lambda kv: ("S3" in kv[0], kv[0]))


def _service(res: dict[str, Any]) -> list[str]:
    sv = res.get("service")
    if not sv:
        return []
    lines = ["## Service API under load", ""]
    if "error" in sv or "skipped" in sv:
        return [*lines, sv.get("error") or sv.get("skipped", ""), ""]
    body = sv.get("result", sv)
    lines += ["| measure | value |", "|---|---|"]
    for k, v in _flatten(body).items():
        if k in ("suite_s",):
            continue
        lines.append(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |")
    lines.append("")
    return lines


def _split(res: dict[str, Any]) -> list[str]:
    """One large input file packed with --workers 1 and 2 (ferry cuts it into sub-units)."""
    sp = res.get("split")
    if not sp:
        return []
    lines = ["## Pack one large input file: --workers 1 vs 2", ""]
    if "error" in sp or "skipped" in sp:
        return [*lines, sp.get("error") or sp.get("skipped", ""), ""]
    body = sp.get("result", sp)
    lines += [
        "| input | w1 s | w2 s | w2 vs w1 | units | shards (unsplit) | same version |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, case in body.get("cases", {}).items():
        sec = case.get("seconds", {})
        ratio = case.get("ratio_w2_vs_w1")
        lines.append(
            f"| {name} | {_m(sec.get('w1'), 1, 2)} | {_m(sec.get('w2'), 1, 2)} | "
            f"{f'{ratio:.2f}x' if ratio else '—'} | {case.get('units', '—')} | "
            f"{case.get('shards', '—')} ({case.get('shards_without_split', '—')}) | {case.get('identical_versions')} |"
        )
    lines += ["", "JSON Lines cases pin the tokenizer to one thread (`RAYON_NUM_THREADS=1`) except "
              "`jsonl-tokenizer-threads`; target ≥ 1.8× on 2 cores where the input's decoding is not already "
              "using both.", ""]  # fmt: skip
    return lines


def _overall(runs: list[dict[str, Any]]) -> str:
    """Tokens/s from construction on (first batch included); derived where a run did not report it."""
    for r in runs:
        if "error" not in r and "overall_tokens_per_s" not in r and r.get("seconds"):
            r["overall_tokens_per_s"] = (r["tokens_per_s"] * r["seconds"] + 16 * 2048) / (
                r["first_batch_s"] + r["seconds"]
            )
    return _cell(runs, "overall_tokens_per_s")


def _remote(res: dict[str, Any]) -> list[str]:
    """Training from S3 through the netem proxy: cold start, throughput, stalls, bytes, memory; and the limit."""
    rm = res.get("remote")
    if not rm:
        return []
    lines = ["## Training from a remote replica (moto behind the netem proxy)", ""]
    if "error" in rm:
        return [*lines, rm["error"], ""]
    link = rm.get("link", {})
    lines += [
        f"Batch {rm.get('batch_size')} x {rm.get('seq_len', 0) + 1}, cold caches of {rm.get('cache_shards')} shards, "
        f"{link.get('conn_rate', 0) / 1e6:.0f} MB/s per connection, {link.get('total_rate', 0) / 1e6:.0f} MB/s in all.",
        "",
        "| RTT | step | tool | first batch s | tokens/s after it | tokens/s overall | stall share | "
        "stall share, 2nd half | downloaded ÷ delivered | peak RSS MiB | cores busy |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in rm.get("cases", []):
        rtt = f"{case.get('rtt_s', 0) * 1e3:.0f} ms"
        if "limit" in case:
            lim = case["limit"]
            text = lim.get("error") or f"{lim.get('mb_per_s', 0):.0f} MB/s = {_m(lim.get('tokens_per_s'))}M tokens/s"
            lines.append(f"| {rtt} | — | bare ranged GETs (limit) | — | {text} | — | — | — | 1 | — | — |")
            continue
        step = f"{case.get('step_s', 0) * 1e3:.0f} ms"
        lines += [_remote_row(rtt, step, tool, runs, overall=True) for tool, runs in case.get("runs", {}).items()]
    lines.append("")
    return [*lines, *_remote_global(rm), *_remote_link(rm)]


def _remote_link(rm: dict[str, Any]) -> list[str]:
    """Streaming at the link's speed: ferry's rate after its first batch as a share of the bare-GET limit."""
    link = rm.get("streaming")
    if not link:
        return []
    lines = [
        f"Streaming at the link's speed: {link.get('shards')} shards, {link.get('stored_bytes', 0) / 1e6:.0f} MB "
        f"stored, {link.get('rtt_s', 0) * 1e3:.0f} ms RTT, cold cache, no step, window shuffle; each ferry run "
        "alternated with the limit (bare parallel ranged GETs of the same stored bytes, the fastest of several "
        "part sizes and connection counts) in one proxy:",
        "",
        "| what | tokens/s after the first batch | share of the limit (medians) | first batch s | CPU s after it | "
        "cores busy |",
        "|---|---|---|---|---|---|",
    ]
    for what, runs in link.get("runs", {}).items():
        share = (link.get("shares", {}).get(what) or {}).get("of_limit")
        limit = link.get("limit_tokens_per_s")
        cell = f"= {_m(limit)}M (its best layout)" if what == "limit" and limit else "—"
        cell = f"{share:.0%}" if share is not None else cell
        first = "—" if what == "limit" else _cell(runs, "first_batch_s", 1, 2)
        busy, cpu = _cell(runs, "cores_busy", 1, 2), _cell(runs, "cpu_s", 1, 2)
        lines.append(f"| {what} | {_cell(runs, 'tokens_per_s')}M | {cell} | {first} | {cpu} | {busy} |")
    return [*lines, ""]


def _staging(res: dict[str, Any]) -> list[str]:
    """The staging suite: data-wait share and epoch time with staging off / on / warm; remote bytes of 2 x 2 ranks."""
    st = res.get("staging")
    if not st:
        return []
    lines = ["## Staging: training from a remote replica on a cold cluster", ""]
    if "error" in st:
        return [*lines, st["error"], ""]
    link, data = st.get("link", {}), st.get("dataset", {})
    lines += [
        f"{data.get('shards')} shards, {data.get('stored_bytes', 0) / 1e6:.1f} MB stored; batch {st.get('batch_size')} "
        f"x {st.get('seq_len', 0) + 1}, a {st.get('step_s', 0) * 1e3:.0f} ms step after {st.get('setup_s')} s of "
        f"setup; {st.get('rtt_s', 0) * 1e3:.0f} ms RTT, {link.get('conn_rate', 0) / 1e6:.0f} MB/s per connection, "
        f"{link.get('total_rate', 0) / 1e6:.0f} MB/s in all.",
        "",
        "| case | data-wait share per rank | first batch s | epoch s | remote MB ÷ dataset MB |",
        "|---|---|---|---|---|",
    ]
    stored = data.get("stored_bytes") or 1
    for case in st.get("cases", []):
        runs = case.get("runs", [])
        ok = [r for r in runs if "error" not in r]
        shares = ", ".join(f"{r['wait_share']:.2%}" for r in ok) + (" (a rank failed)" if len(ok) < len(runs) else "")
        first = ", ".join(f"{r['first_wait_s']:.2f}" for r in ok)
        epoch = ", ".join(f"{r['epoch_s']:.1f}" for r in ok)
        lines.append(f"| {case['what']} | {shares} | {first} | {epoch} | {case['remote_bytes'] / stored:.2f} |")
    return [*lines, ""]


def _remote_row(rtt: str, step: str, tool: str, runs: list[dict[str, Any]], *, overall: bool) -> str:
    """One row of a remote table (an error in the first cell when every run failed)."""
    err = next((str(r["error"]) for r in runs if "error" in r), None)
    if err and not any("error" not in r for r in runs):
        segments = [seg.strip() for seg in err.split("|") if seg.strip()]  # a traceback's lines, joined by |
        text = next((seg for seg in reversed(segments) if "Error" in seg), segments[-1] if segments else err)[:160]
        return f"| {rtt} | {step} | {tool} | failed: {text} |" + " |" * (7 if overall else 5)
    mid = f" {_overall(runs)}M |" if overall else ""
    late_cell = _cell(runs, "late_stall_share", 0.01, 1)
    late = f" {late_cell}{'' if late_cell == '—' else '%'} |" if overall else ""
    return (
        f"| {rtt} | {step} | {tool} | {_cell(runs, 'first_batch_s', 1, 2)} | {_cell(runs, 'tokens_per_s')}M |{mid} "
        f"{_cell(runs, 'stall_share', 0.01, 1)}% |{late} {_cell(runs, 'downloaded_per_delivered', 1, 2)} | "
        f"{_cell(runs, 'peak_rss_mb', 1, 0)} | {_cell(runs, 'cores_busy', 1, 2)} |"
    )


def _remote_global(rm: dict[str, Any]) -> list[str]:
    """ferry's shuffle="global" over a dataset many times its cache (frames, not shards), same link."""
    cases = rm.get("global") or []
    if not cases:
        return []
    over = cases[0].get("global_over")
    lines = [
        f'shuffle="global" over a dataset {over}x the cache (ferry reads seekable frames; the peers at the same '
        "cache with their closest shuffles: litdata's shuffle=True, MosaicML's all-to-all naive shuffle):",
        "",
        "| RTT | step | dataset | first batch s | tokens/s after it | stall share | downloaded ÷ delivered | "
        "peak RSS MiB | cores busy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        rtt, step = f"{case.get('rtt_s', 0) * 1e3:.0f} ms", f"{case.get('step_s', 0) * 1e3:.0f} ms"
        lines += [_remote_row(rtt, step, tool, runs, overall=False) for tool, runs in case.get("runs", {}).items()]
    lines.append("")
    return lines


def _media(res: dict[str, Any]) -> list[str]:
    import suite_media

    return suite_media.section(res.get("media"))


def _ray_sync(res: dict[str, Any]) -> list[str]:
    import suite_ray_sync

    return suite_ray_sync.section(res.get("ray_sync"))


def _fleet_sim(res: dict[str, Any]) -> list[str]:
    import suite_fleet_sim

    return suite_fleet_sim.section(res.get("fleet_sim"))


def _swarm(res: dict[str, Any]) -> list[str]:
    import suite_swarm

    return suite_swarm.section(res.get("swarm"))


def _scale(res: dict[str, Any]) -> list[str]:
    import suite_scale

    return suite_scale.section(res.get("scale"))


def _schedule(res: dict[str, Any]) -> list[str]:
    """Loader throughput with a mixture schedule against a single-phase mixture; resume cost by phases."""
    sc = res.get("schedule")
    if not sc:
        return []
    lines = ["## Mixture schedules", ""]
    if "error" in sc or "skipped" in sc:
        return [*lines, sc.get("error") or sc.get("skipped", ""), ""]
    runs = sc.get("throughput", {})
    lines += ["| mixture | samples/s | samples per CPU second |", "|---|---|---|"]
    for what, rs in runs.items():
        lines.append(f"| {what} | {_cell(rs, 'samples_per_s', 1, 0)} | {_cell(rs, 'samples_per_cpu_s', 1, 0)} |")
    if "ratio" in sc:
        lines += [
            "",
            f"Schedule ÷ single phase: {sc['ratio']:.3f} in samples/s, {sc.get('ratio_cpu', 0):.3f} per CPU second "
            f"(target ≥ {sc.get('target', 0):.2f}).",
        ]
    lines += ["", "| phases | position | resume s (set-up + `load_state_dict` + first batch) |", "|---|---|---|"]
    lines += [f"| {r['phases']} | {r['position']:.0e} | {r['resume_s']:.3f} |" for r in sc.get("resume", [])]
    return [*lines, ""]


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}." if not isinstance(v, dict) else f"{prefix}{k}."))
        return {k.rstrip("."): v for k, v in out.items()}
    out[prefix] = d
    return out


def _profiles(res: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for suite, key in (("pack", "profile"), ("load", "profile"), ("sync", "profile"), ("sync", "profile_s3")):
        prof = (res.get(suite) or {}).get(key)
        if prof:
            lines += [
                f"### Profile: ferry {suite} ({prof.get('case')}), top functions",
                "",
                "```",
                prof.get("text", "").strip()[:6000],
                "```",
                "",
            ]
    analysis = HERE / "analysis.md"
    if analysis.exists():
        lines = [analysis.read_text().strip(), "", *lines]
    return ["## Where ferry is behind, and why", "", *lines] if lines else []


def _headline_rows(res: dict[str, Any]) -> list[str]:
    rows: list[str] = []
    p = res.get("pack") or {}
    for case in p.get("cases", []):
        for peer, r in case.get("ratio_vs", {}).items():
            rows.append(f"| pack zstd-{case['level']}, {case['workers']} worker(s) | {LABEL[peer]} | {r:.2f}x |")
    ld = res.get("load") or {}
    for w, case in (ld.get("throughput") or {}).items():
        for peer, r in case.get("ratio_vs", {}).items():
            rows.append(f"| load tokens/s, {w} workers | {LABEL[peer]} | {r:.2f}x |")
        frac = of_limit(case["runs"], "memmap-limit")
        if frac:
            rows.append(f"| load tokens/s, {w} workers | {LABEL['memmap-limit']} | {frac:.2f}x |")
    rs = (ld.get("resume") or {}).get("runs", {})
    f_res = _med(rs.get("ferry", []), "resume_s")
    for peer in PEERS:
        p_res = _med(rs.get(peer, []), "resume_s")
        if f_res and p_res:
            rows.append(
                f"| resume at 90% → first batch (peer time ÷ ferry time) | {LABEL[peer]} | {_speed(p_res / f_res)} |"
            )
    sy = res.get("sync") or {}
    for link, case in _links(sy):
        if case.get("ratio_vs_rclone"):
            rows.append(f"| sync MB/s {link} | {LABEL['rclone']} | {case['ratio_vs_rclone']:.2f}x |")
        if case.get("noop_speedup_vs_rclone"):
            rows.append(
                f"| no-op resync {link} (rclone time ÷ ferry time) | {LABEL['rclone']} | "
                f"{_speed(case['noop_speedup_vs_rclone'])} |"
            )
    import suite_media
    import suite_ray_sync

    return rows + suite_media.headline_rows(res.get("media")) + suite_ray_sync.headline_rows(res.get("ray_sync"))


def _speed(r: float) -> str:
    return f"{r:.2f}x (ferry faster)" if r >= 1 else f"{r:.2f}x (ferry {1 / r:.1f}x slower)"


def headline(res: dict[str, Any]) -> str:
    """The ratios, as text for the terminal."""
    rows = _headline_rows(res)
    return "\n".join(["ferry vs peers (ratio > 1: ferry ahead)", *rows]) if rows else "no ratios measured"


def _charts(res: dict[str, Any], img_dir: Path, python: str | None) -> None:
    """PNG charts via matplotlib in the peers' venv (ferry's venv does not carry matplotlib)."""
    img_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(res, f, default=str)
    cmd = [python or sys.executable, str(HERE / "charts.py"), f.name, str(img_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"charts skipped: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
    Path(f.name).unlink(missing_ok=True)


def _seek(res: dict[str, Any]) -> list[str]:
    """The seekable stored format (3; 2 in older results) against format 1: pack cost, frame sizes, cold first
    batch."""
    sk = res.get("seek")
    if not sk:
        return []
    seekable = "f3" if "f3" in sk.get("pack", {}).get("ratio", {}) else "f2"
    lines = [f"## Seekable shards: format {seekable[1:]} against format 1", ""]
    if "error" in sk and "pack" not in sk:
        return [*lines, str(sk["error"]), ""]
    pk = sk.get("pack", {})
    tps, ratio = pk.get("tokens_per_s", {}), pk.get("ratio", {})
    lines += [
        "| format | pack Mtok/s | ratio | cold first batch s (open + batch) | batch alone s | frames read |",
        "|---|---|---|---|---|---|",
    ]
    for t in ("f1", seekable):
        fb = sk.get("first_batch", {}).get(t, {})
        first, alone = ((fb.get(k) or {}).get("median") for k in ("first_batch_s", "batch_s"))
        frames = (fb.get("frames") or {}).get("median", "—")
        cells = [t[1:], _m(tps.get(t)), _m(ratio.get(t), 1, 4), _m(first, 1, 3), _m(alone, 1, 3), str(frames)]
        lines.append("| " + " | ".join(cells) + " |")
    if "ratio_cost" in pk:
        median = pk.get("median_cpu_speed_cost")
        medians = "" if median is None else f"; {median * 100:.2f}% by the medians"
        default = pk.get("seekable_by_default", pk.get("format_2_by_default"))
        lines += ["", f"Format {seekable[1:]} costs {pk['ratio_cost'] * 100:.2f}% ratio, "
                  f"{pk['cpu_speed_cost'] * 100:.2f}% pack throughput per CPU second (best of {sk.get('repeats')} "
                  f"alternated runs{medians}; {pk['speed_cost'] * 100:.2f}% wall clock) at zstd {sk.get('level')}; "
                  f"format {seekable[1:]} may be the default: {default} (needs ≤ 3% and ≤ 5%)."]  # fmt: skip
    sizes = sk.get("frame_sizes", {})
    if sizes:
        lines += ["", "| frames of one shard | ratio | MiB/s (CPU) |", "|---|---|---|"]
        lines += [f"| {k} | {v['ratio']:.4f} | {v['mib_per_s']:.0f} |" for k, v in sizes.items() if isinstance(v, dict)]
    lines.append("")
    return lines


def write(res: dict[str, Any], page: Path, peers_python: str | None, results_rel: str) -> None:
    """Generate the page (and its charts under ``img/`` beside it)."""
    _charts(res, page.parent / "img", peers_python)
    lines = [
        "# Benchmarks: ferry side by side with litdata, MosaicML streaming and rclone",
        "",
        f"Generated by `make bench` from [`{results_rel}`]({results_rel}). Do not edit: rerun `make bench`.",
        "",
        "## Headline (ratio > 1 means ferry is ahead)",
        "",
        "| measure | against | ferry ÷ peer |",
        "|---|---|---|",
        *_headline_rows(res),
        "",
        *_machine(res),
        *_method(res),
        *_pack(res),
        *_load(res),
        *_scaling(res),
        *_sync(res),
        *_service(res),
        *_split(res),
        *_schedule(res),
        *_seek(res),
        *_remote(res),
        *_staging(res),
        *_media(res),
        *_ray_sync(res),
        *_fleet_sim(res),
        *_swarm(res),
        *_scale(res),
        *_profiles(res),
    ]
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text("\n".join(lines).rstrip() + "\n")
