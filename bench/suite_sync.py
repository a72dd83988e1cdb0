"""Sync: MB/s local→local and local→S3 (moto), and the no-op re-run — ferry vs rclone, with limits.

The limits: ``cp -r`` locally; to S3, bare presigned PUTs of every file from the same number of
threads (``runners/s3_put_limit.py``: no hashing, no verification), whose PUT-only time shows what
the server itself takes.

The data set is a real ferry dataset (shards of ~32 MiB, random tokens so zstd cannot shrink
them), made once and cached. Every tool is a CLI, timed from outside as a user sees it (process
start included, the same for all). Destinations are emptied between runs (not timed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from harness import Context, alternate, log, summary

__all__ = ["prepare", "run"]

TRANSFERS = 4
SHARD_MIB = 32


def _make_dataset(root: Path, mib: int) -> tuple[str, int, int]:
    """A ferry dataset of ``mib`` MiB stored bytes (cached). Returns (path, shards, stored bytes)."""
    import numpy as np

    from ferry.shard_tools import PackOptions, open_dataset, pack_documents

    shard_mib = min(SHARD_MIB, max(1, mib // 8))
    path = root / f"src-{mib}MiB"
    if not (path / "manifest.json").exists():
        shutil.rmtree(path, ignore_errors=True)
        log(f"sync: making a {mib} MiB dataset of {shard_mib} MiB shards")
        doc = 65_535
        ndocs = mib * 2**20 // (2 * (doc + 1))
        rng = np.random.default_rng(11)
        docs = (rng.integers(0, 50256, doc, dtype=np.int64) for _ in range(ndocs))
        pack_documents(
            docs, str(path), PackOptions(vocab_size=50257, eos_id=50256, shard_size=shard_mib * 2**20, progress=False)
        )
    m = open_dataset(str(path)).manifest
    return str(path), len(m.shards), int(m.shards.stored_bytes.sum())


def prepare(ctx: Context, mib: int) -> None:
    """Make (or find) the sync data set ahead of the measurements."""
    root = ctx.data / "sync"
    root.mkdir(parents=True, exist_ok=True)
    _make_dataset(root, mib)


def _timed(cmd: list[str], env: dict[str, str], timeout: float = 900) -> tuple[float, str | None, str]:
    """(wall seconds, error or None, stdout)."""
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return time.perf_counter() - t0, f"timed out after {timeout:.0f}s", ""
    dt = time.perf_counter() - t0
    if proc.returncode != 0:
        return dt, f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()[-300:]}", proc.stdout
    return dt, None, proc.stdout


@contextmanager
def _moto(ctx: Context) -> Iterator[dict[str, str]]:
    """A moto S3 server on 127.0.0.1 for the duration of the suite."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {
        **os.environ,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    env.pop("AWS_CA_BUNDLE", None)  # rclone fails with LoadCustomCABundleError otherwise
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.Popen(
        [ctx.ferry_python, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        env.update(
            {
                "FSSPEC_S3_ENDPOINT_URL": endpoint,
                "RCLONE_CONFIG_MOTO_TYPE": "s3",
                "RCLONE_CONFIG_MOTO_PROVIDER": "Other",
                "RCLONE_CONFIG_MOTO_ENDPOINT": endpoint,
                "RCLONE_CONFIG_MOTO_ACCESS_KEY_ID": "testing",
                "RCLONE_CONFIG_MOTO_SECRET_ACCESS_KEY": "testing",
                "RCLONE_CONFIG_MOTO_REGION": "us-east-1",
                "RCLONE_CONFIG_MOTO_FORCE_PATH_STYLE": "true",
            }
        )
        yield env
    finally:
        proc.terminate()
        proc.wait(10)


def _s3fs(env: dict[str, str]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": env["FSSPEC_S3_ENDPOINT_URL"]},
        skip_instance_cache=True,
    )


def run(ctx: Context, rclone: str | None = None, mib: int = 1024) -> dict[str, Any]:
    root = ctx.data / "sync"
    root.mkdir(parents=True, exist_ok=True)
    src, shards, nbytes = _make_dataset(root, mib)
    ferry = str(Path(ctx.ferry_python).parent / "ferry")
    tools = ["ferry"] + (["rclone"] if rclone else [])
    result: dict[str, Any] = {"shards": shards, "bytes": nbytes, "transfers": TRANSFERS, "links": {}}
    if not rclone:
        result["note"] = "rclone was not available (not root, or --no-peers): ferry and cp only."

    def measure(cmd: list[str], env: dict[str, str], noop: bool) -> dict[str, Any]:
        dt, err, stdout = _timed(cmd, env)
        if err:
            return {"error": err}
        out: dict[str, Any] = {"seconds": dt, "mb_per_s": nbytes / dt / 1e6}
        if "put_s" in stdout:  # the upload limit also reports its PUTs alone (no process start)
            put_s = float(json.loads(stdout.strip().splitlines()[-1])["put_s"])
            out.update({"put_s": put_s, "put_mb_per_s": nbytes / put_s / 1e6})
        if noop:
            dt2, err2, _ = _timed(cmd, env)
            out.update({"noop_s": dt2} if not err2 else {"noop_error": err2})
        return out

    def cmd_for(tool: str, dst: str, s3: bool) -> list[str]:
        if tool == "ferry":
            return [ferry, "sync", src, dst, "--transfers", str(TRANSFERS), "--json", "--no-progress"]
        if tool == "rclone":
            target = "moto:" + dst[len("s3://") :] if s3 else dst
            return [str(rclone), "sync", src, target, "--transfers", str(TRANSFERS), "--checksum"]
        if tool == "put-limit":
            spec = json.dumps({"src": src, "dst": dst, "transfers": TRANSFERS})
            return [ctx.ferry_python, str(Path(__file__).parent / "runners" / "s3_put_limit.py"), spec]
        return ["cp", "-r", src, dst]

    # local -> local (+ cp -r as the limit)
    env = dict(os.environ)
    env.pop("AWS_CA_BUNDLE", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as in a user's shell: bytecode is cached

    def local_one(tool: str, _r: int) -> dict[str, Any]:
        dst = str(root / f"dst-{tool}")
        shutil.rmtree(dst, ignore_errors=True)
        subprocess.run(["sync"], check=False)  # flush the previous run's dirty pages outside the clock
        res = measure(cmd_for(tool, dst, False), env, noop=tool != "cp")
        shutil.rmtree(dst, ignore_errors=True)
        return res

    runs = alternate(ctx, [*tools, "cp"], local_one, repeats=_repeats(ctx), what="sync local→local")
    result["links"]["local→local"] = {"runs": runs, **_ratios(runs)}

    # local -> S3 (moto)
    try:
        with _moto(ctx) as s3env:
            fs = _s3fs(s3env)
            counter = iter(range(10_000))

            def s3_one(tool: str, _r: int) -> dict[str, Any]:
                bucket = f"bench-{tool}-{next(counter)}"
                fs.mkdir(bucket)
                res = measure(cmd_for(tool, f"s3://{bucket}/ds", True), s3env, noop=tool != "put-limit")
                try:
                    fs.rm(bucket, recursive=True)  # free moto's memory
                except Exception as exc:  # noqa: BLE001 — cleanup only
                    log(f"sync: could not remove {bucket}: {exc}")
                return res

            runs = alternate(ctx, [*tools, "put-limit"], s3_one, repeats=_repeats(ctx), what="sync local→S3")
            result["links"]["local→S3 (moto)"] = case = {"runs": runs, **_ratios(runs)}
            if (
                ctx.profile
                and ctx.peers_python
                and (case.get("ratio_vs_rclone", 99) < 1.5 or case.get("noop_speedup_vs_rclone", 99) < 10)
            ):
                result["profile_s3"] = _profile_s3(ctx, fs, cmd_for, s3env)
    except Exception as exc:  # noqa: BLE001 — report, keep the local numbers
        print(f"sync to S3 failed: {exc}", file=sys.stderr)
        result["links"]["local→S3 (moto)"] = {"runs": {}, "error": str(exc)}
    result["profile"] = _maybe_profile(ctx, result, src, root, cmd_for, env)
    return result


def _repeats(ctx: Context) -> int:
    """At least 5 alternating runs per tool outside --quick: one copy run can take several times another
    (page-cache allocation in the kernel, see bench/analysis.md), and a median of 3 moves with one outlier."""
    return ctx.repeats if ctx.quick else max(ctx.repeats, 5)


def _maybe_profile(
    ctx: Context, result: dict[str, Any], src: str, root: Path, cmd_for: Any, env: dict[str, str]
) -> dict[str, Any] | None:
    """py-spy of ``ferry sync`` (local→local, full copy then no-op) when it misses a target."""
    local = result["links"].get("local→local", {})
    if not ctx.profile:
        return None
    if local.get("ratio_vs_rclone", 99) >= 1.5 and local.get("noop_speedup_vs_rclone", 99) >= 10:
        return None
    spy = str(Path(ctx.peers_python).parent / "py-spy") if ctx.peers_python else None
    if not spy or not Path(spy).exists():
        return {"case": "local→local", "text": "py-spy not available (no peers' venv)"}
    import pyspy

    log("sync: ferry misses a target; profiling ferry sync with py-spy")
    dst = str(root / "dst-profile")
    shutil.rmtree(dst, ignore_errors=True)
    full = pyspy.top(spy, cmd_for("ferry", dst, False), env)
    noop = pyspy.top(spy, cmd_for("ferry", dst, False), env)
    shutil.rmtree(dst, ignore_errors=True)
    return {"case": "local→local, py-spy", "text": f"full copy:\n{full}\n\nno-op re-run:\n{noop}"}


def _profile_s3(ctx: Context, fs: Any, cmd_for: Any, env: dict[str, str]) -> dict[str, Any]:
    """py-spy of ``ferry sync`` to S3 (moto): full copy, then the no-op re-run."""
    import pyspy

    assert ctx.peers_python is not None
    spy = str(Path(ctx.peers_python).parent / "py-spy")
    if not Path(spy).exists():
        return {"case": "local→S3", "text": "py-spy not available"}
    log("sync: ferry misses an S3 target; profiling ferry sync to S3 with py-spy")
    fs.mkdir("bench-profile")
    full = pyspy.top(spy, cmd_for("ferry", "s3://bench-profile/ds", True), env)
    noop = pyspy.top(spy, cmd_for("ferry", "s3://bench-profile/ds", True), env)
    with contextlib.suppress(Exception):
        fs.rm("bench-profile", recursive=True)
    return {"case": "local→S3 (moto), py-spy", "text": f"full copy:\n{full}\n\nno-op re-run:\n{noop}"}


def _ratios(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def med(tool: str, key: str) -> float | None:
        s = summary(runs.get(tool, []), key)
        return None if s is None else s["median"]

    out: dict[str, Any] = {}
    f_mb, r_mb = med("ferry", "mb_per_s"), med("rclone", "mb_per_s")
    if f_mb and r_mb:
        out["ratio_vs_rclone"] = f_mb / r_mb
    f_n, r_n = med("ferry", "noop_s"), med("rclone", "noop_s")
    if f_n and r_n:
        out["noop_speedup_vs_rclone"] = r_n / f_n
    c_mb = med("cp", "mb_per_s")
    if f_mb and c_mb:
        out["fraction_of_cp"] = f_mb / c_mb
    limit_mb, put_mb = med("put-limit", "mb_per_s"), med("put-limit", "put_mb_per_s")
    if f_mb and limit_mb:
        out["fraction_of_put_limit"] = f_mb / limit_mb
    if r_mb and put_mb:  # no uploader, even with no start-up at all, gets past this against rclone
        out["put_ceiling_vs_rclone"] = put_mb / r_mb
    return out
