"""Load: tokens/s and tokens per CPU second delivered to a training loop, time to first batch, a cold epoch,
resume at 90%, peak RSS.

Batch 16 x 2049 tokens (input_ids and labels, 2048 each, int64: two views of one widened buffer, as the peers'
runners give them; ferry also with its default of two separate tensors), shuffle on, 0 and 2 DataLoader
workers. Each tool reads its own level-1 pack output of the same corpus; its node-local cache
persists across repeats, so the first (cold) run is reported apart and the timed repeats measure
steady state. A cold epoch reads one whole epoch from a fresh cache, timed from the build on, against
the limit of decompressing zstd chunks of the raw stream and gathering the windows from them.
Every loader runner has ``OMP_NUM_THREADS=1`` (torch's intra-op threads only fight the loader for the cores).
Resume: an uninterrupted run saves its state at 90% of the epoch and digests the next
batches; fresh processes load that state and must deliver the same batches.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import suite_pack
from harness import Context, Runner, alternate, log, ratios, summary

__all__ = ["run", "LOADER_ENV"]

LOADER_ENV = (("OMP_NUM_THREADS", "1"),)  # every loader runner's environment, peers' and limits' alike
LIMITS = ("memmap-limit", "unzstd-limit")
# every runner hands the loop input_ids and labels as two views of one widened [B, seq_len + 1] buffer (the peers'
# runners slice their batch; ferry with shared_labels=True); this row is ferry's default, two contiguous tensors
SEPARATE = "ferry-separate"

BATCH = 16
SEQ_LEN = 2048
CHECK_BATCHES = 8
SEED = 1234
EPOCH_REPEATS = 7


def _tools(ctx: Context) -> dict[str, tuple[Runner, str]]:
    """tool -> (runner, data path it reads)."""
    env = LOADER_ENV
    packed = suite_pack.out_dir(ctx, "ferry", 1, 1)
    out: dict[str, tuple[Runner, str]] = {
        "ferry": (Runner("ferry", "ferry_load.py", ctx.ferry_python, env), packed),
        SEPARATE: (Runner(SEPARATE, "ferry_load.py", ctx.ferry_python, env), packed),
    }
    if ctx.peers_python:
        out["litdata"] = (
            Runner("litdata", "litdata_load.py", ctx.peers_python, env),
            suite_pack.out_dir(ctx, "litdata", 1, 1),
        )
        out["mosaic"] = (
            Runner("mosaic", "mosaic_load.py", ctx.peers_python, env),
            suite_pack.out_dir(ctx, "mosaic", 1, 1),
        )
    out["memmap-limit"] = (Runner("memmap-limit", "memmap_load.py", ctx.ferry_python, env), ctx.corpus.stream)
    out["unzstd-limit"] = (
        Runner("unzstd-limit", "unzstd_gather_limit.py", ctx.ferry_python, env),
        ctx.corpus.stream,
    )
    return out


def _ensure_packed(ctx: Context, tools: dict[str, tuple[Runner, str]]) -> None:
    """The pack suite leaves these behind; pack once here when it did not run."""
    marker = {"ferry": "manifest.json", "litdata": "index.json", "mosaic": "index.json"}
    pack_runners = suite_pack._runners(ctx)
    for tool, (_runner, path) in tools.items():
        if tool in marker and not os.path.exists(os.path.join(path, marker[tool])):
            log(f"load: packing the {tool} dataset first")
            c = ctx.corpus
            args = {
                "inputs": c.files,
                "out": path,
                "level": 1,
                "workers": 1,
                "shard_size": suite_pack.SHARD_SIZE,
                "vocab_size": c.spec.vocab_size,
                "eos_id": c.spec.eos_id,
                "seq_len": SEQ_LEN,
            }
            res = pack_runners[tool](ctx, args)
            if "error" in res:
                log(f"load: packing for {tool} failed: {res['error']}")


def _base(ctx: Context, tool: str, data: str, workers: int) -> dict[str, Any]:
    return {
        "data": data,
        "cache_dir": str(ctx.data / "cache" / f"{tool}-w{workers}"),
        "seq_len": SEQ_LEN,
        "batch_size": BATCH,
        "seed": SEED,
        "workers": workers,
        "min_seconds": 0.5 if ctx.quick else 3.0,
        "min_batches": 10 if ctx.quick else 30,
        "check_batches": CHECK_BATCHES,
        "shared_labels": tool == "ferry",
    }


def run(ctx: Context) -> dict[str, Any]:
    tools = _tools(ctx)
    _ensure_packed(ctx, tools)
    shutil.rmtree(ctx.data / "cache", ignore_errors=True)
    result: dict[str, Any] = {"batch_size": BATCH, "seq_len": SEQ_LEN, "throughput": {}, "resume": {}}
    result["epoch"] = {}
    _unzstd_input(ctx, tools)
    for workers in [0] if ctx.quick else [0, 2]:
        names = [t for t in tools if not (t in LIMITS and workers)]
        cold: dict[str, dict[str, Any]] = {}
        for t in [t for t in names if t != "unzstd-limit"]:  # cold: fresh cache, first contact with the data
            runner, data = tools[t]
            _settle_disk()
            # only its first batch is reported: a short run
            cold[t] = runner(ctx, {**_base(ctx, t, data, workers), "mode": "throughput", "min_seconds": 0.3})
            log(f"load w{workers} {t} cold: {cold[t].get('error') or round(cold[t].get('first_batch_s', 0), 3)}")

        def one(tool: str, _r: int, workers: int = workers) -> dict[str, Any]:
            runner, data = tools[tool]
            return runner(ctx, {**_base(ctx, tool, data, workers), "mode": "throughput"})

        steady = [t for t in names if t != "unzstd-limit"]  # warm, it is the memmap limit again
        runs = alternate(ctx, steady, one, what=f"load w{workers}")
        result["throughput"][str(workers)] = {"runs": runs, "cold": cold, **ratios(runs, "memmap-limit")}
        epochs = alternate(
            ctx, names, lambda t, r, w=workers: _epoch(ctx, tools, t, r, w), _epoch_repeats(ctx), f"epoch w{workers}"
        )
        result["epoch"][str(workers)] = {"runs": epochs, **ratios(epochs, "unzstd-limit")}
    result["resume"] = _resume(ctx, [t for t in tools if t not in ("unzstd-limit", SEPARATE)], tools)
    result["profile"] = _maybe_profile(ctx, tools["ferry"], result)
    return result


def _unzstd_input(ctx: Context, tools: dict[str, tuple[Runner, str]]) -> None:
    """The zstd limit's compressed chunks, made by one untimed epoch of its runner: its first timed epoch would
    otherwise include compressing them."""
    runner, data = tools["unzstd-limit"]
    args = {**_base(ctx, "unzstd-limit", data, 0), "cache_dir": str(ctx.data / "cache" / "unzstd-input")}
    res = runner(ctx, {**args, "mode": "epoch"})
    log(f"load: unzstd-limit input chunks made ({res.get('error') or 'untimed'})")


def _epoch(ctx: Context, tools: dict[str, tuple[Runner, str]], tool: str, repeat: int, workers: int) -> dict[str, Any]:
    """One cold epoch of ``tool``: a fresh cache, removed after."""
    runner, data = tools[tool]
    cache = ctx.data / "cache" / f"epoch-{tool}-w{workers}-{repeat}"
    shutil.rmtree(cache, ignore_errors=True)
    _settle_disk()
    try:
        args = {**_base(ctx, tool, data, workers), "cache_dir": str(cache), "mode": "epoch"}
        if tool == "unzstd-limit":  # its compressed chunks are its input, made once: only the decompression is timed
            args["cache_dir"] = str(ctx.data / "cache" / "unzstd-input")
        return runner(ctx, args)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _epoch_repeats(ctx: Context) -> int:
    """Cold epochs per tool: at least ``EPOCH_REPEATS`` in a full run. An epoch of ferry lasts a fifth of a second,
    and on a shared 2-core VM one run in three or four meets the host's own work (its first batch or its whole
    epoch then takes up to three times longer), which moves a median of three; more runs cost seconds."""
    return ctx.repeats if ctx.quick else max(ctx.repeats, EPOCH_REPEATS)


def _settle_disk() -> None:
    """Write out what earlier runs left to the disk before a timed cold run: the files they wrote and removed
    (the filesystem's journal, and the discards of a disk mounted with ``discard``) are otherwise written
    out by kernel threads on the same cores during the next run, which then takes up to several times longer
    to its first batch."""
    os.sync()


def _resume(ctx: Context, names: list[str], tools: dict[str, tuple[Runner, str]]) -> dict[str, Any]:
    """Reference run to 90% (0 workers), then timed resumes; one more resume with 2 workers."""
    refs: dict[str, dict[str, Any]] = {}
    for t in names:
        runner, data = tools[t]
        state_file = str(ctx.data / f"state-{t}.json")
        refs[t] = runner(ctx, {**_base(ctx, t, data, 0), "mode": "reference", "state_file": state_file})
        log(f"resume {t} reference: {refs[t].get('error') or refs[t].get('stop_batch')}")

    def one(tool: str, _r: int) -> dict[str, Any]:
        runner, data = tools[tool]
        res = runner(
            ctx, {**_base(ctx, tool, data, 0), "mode": "resume", "state_file": str(ctx.data / f"state-{tool}.json")}
        )
        if "digests" in res and "digests" in refs[tool]:
            res["equal"] = res["digests"] == refs[tool]["digests"]
        return res

    ok = [t for t in names if "digests" in refs[t]]
    runs = alternate(ctx, ok, one, what="resume@90%") if ok else {}
    elastic: dict[str, Any] = {}
    for t in ok:  # the state saved with 0 workers, loaded into a loader with 2 workers
        if t == "memmap-limit" or ctx.quick:
            continue
        runner, data = tools[t]
        # same cache directory as the run that saved the state (litdata records it in the state)
        args = {**_base(ctx, t, data, 2), "cache_dir": _base(ctx, t, data, 0)["cache_dir"]}
        res = runner(ctx, {**args, "mode": "resume", "state_file": str(ctx.data / f"state-{t}.json")})
        if "digests" in res:
            res["equal"] = res["digests"] == refs[t]["digests"]
        elastic[t] = res
        log(f"resume {t} 0->2 workers: {res.get('error') or res.get('equal')}")
    world: dict[str, Any] = {}
    if "ferry" in ok:  # the same state on world size 2 (two ranks of batch 8 = the same global batch)
        runner, data = tools["ferry"]
        elastic_runner = Runner("ferry", "ferry_elastic.py", ctx.ferry_python)
        res = elastic_runner(ctx, {**_base(ctx, "ferry", data, 0), "state_file": str(ctx.data / "state-ferry.json")})
        if "digests" in res:
            res["equal"] = res["digests"] == refs["ferry"]["digests"]
        world["ferry"] = res
        log(f"resume ferry world 1->2: {res.get('error') or res.get('equal')}")
    return {"reference": refs, "runs": runs, "workers_0_to_2": elastic, "world_1_to_2": world}


def _maybe_profile(ctx: Context, ferry: tuple[Runner, str], result: dict[str, Any]) -> dict[str, Any] | None:
    """cProfile of ferry's loop where it misses the throughput targets, and of its resume where a peer resumes
    faster."""
    if not ctx.profile:
        return None
    runner, data = ferry
    texts: list[str] = []
    w0 = result["throughput"].get("0", {})
    if w0.get("ratio_vs_faster_peer", 99) < 3.0 or w0.get("fraction_of_limit", 1.0) < 0.5:
        log("load: ferry misses a throughput target; profiling the 0-worker loop")
        texts.append(
            "0 workers, warm cache, " + runner.profile(ctx, {**_base(ctx, "ferry", data, 0), "mode": "throughput"})
        )
    rs = result.get("resume", {}).get("runs", {})
    ferry_s = (summary(rs.get("ferry", []), "resume_s") or {}).get("median")
    peer_s = [(summary(rs.get(p, []), "resume_s") or {}).get("median") for p in ("litdata", "mosaic")]
    if ferry_s and any(p and p < ferry_s for p in peer_s):
        log("load: a peer resumes faster; profiling ferry's resume")
        args = {**_base(ctx, "ferry", data, 0), "mode": "resume", "state_file": str(ctx.data / "state-ferry.json")}
        texts.append("resume at 90% (construct + load_state_dict + 8 batches), " + runner.profile(ctx, args))
    if not texts:
        return None
    return {"case": "see each part", "text": "\n\n".join(texts)}
