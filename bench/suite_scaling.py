"""Scaling: ferry loader start-up and resume time for manifests of 1k … 1M shards.

Each synthetic dataset's shard table has N rows that all name one tiny real shard (content
addressed, so one file serves every row): the manifest, the shard table and the per-position
permutation are as large as a real N-shard dataset's, while the disk holds a few KiB of tokens.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from harness import Context, Runner, alternate, log

__all__ = ["run"]

DOC_TOKENS = 2047  # + EOS: 4 documents make one 8192-token shard
TINY_DOCS = 4


def _tiny_shard(root: Path) -> Any:
    """Pack one tiny dataset and return its single shard row."""
    import numpy as np

    from ferry.shard_tools import PackOptions, open_dataset, pack_documents

    src = root / "tiny"
    if not (src / "manifest.json").exists():
        shutil.rmtree(src, ignore_errors=True)
        rng = np.random.default_rng(7)
        docs = [rng.integers(0, 50000, DOC_TOKENS, dtype=np.int64) for _ in range(TINY_DOCS)]
        pack_documents(docs, str(src), PackOptions(vocab_size=50257, eos_id=50256, progress=False))
    ds = open_dataset(str(src))
    return src, ds.manifest.shards[0], ds.manifest


def synthesize(root: Path, n: int) -> dict[str, Any]:
    """Publish an ``n``-shard dataset under ``root/<n>`` (reused when already there)."""
    import time

    import pyarrow as pa

    from ferry.shard_tools import ShardTable
    from ferry.shard_tools.format.manifest import Manifest
    from ferry.shard_tools.storage.publish import publish_version
    from ferry.shard_tools.storage.store import resolve

    out = root / f"shards-{n}"
    tiny_root, info, tiny = _tiny_shard(root)
    if (out / "manifest.json").exists() and (out / "build.json").exists():
        return {"path": str(out), "reused": True, **json.loads((out / "build.json").read_text())}
    shutil.rmtree(out, ignore_errors=True)
    (out / "shards").mkdir(parents=True)
    shutil.copyfile(tiny_root / info.path, out / info.path)
    t0 = time.perf_counter()
    schema = ShardTable.from_rows([info])._table.schema
    cols = {name: pa.repeat(pa.scalar(getattr(info, name), type=schema.field(name).type), n) for name in schema.names}
    table = ShardTable(pa.table(cols, schema=schema))
    manifest, data = Manifest.build(
        name=f"scale-{n}",
        token_dtype=tiny.token_dtype,
        tokenizer=tiny.tokenizer,
        eos_appended=tiny.eos_appended,
        shards=table,
        parent=None,
        created_at="2026-11-30T00:00:00+00:00",
        tool_version="bench",
    )
    publish_version(resolve(str(out)), manifest, data, expect_current=None, new_shards=[info.path])
    built = {"build_s": time.perf_counter() - t0}
    (out / "build.json").write_text(json.dumps(built))  # beside the data set, outside its manifest
    return {"path": str(out), "reused": False, **built}


def run(ctx: Context, sizes: list[int] | None = None) -> dict[str, Any]:
    sizes = sizes or ([1_000, 10_000] if ctx.quick else [1_000, 10_000, 100_000, 1_000_000])
    root = ctx.data / "scale"
    root.mkdir(parents=True, exist_ok=True)
    runner = Runner("ferry", "ferry_scale.py", ctx.ferry_python)
    rows: list[dict[str, Any]] = []
    for n in sizes:
        made = synthesize(root, n)
        path = made["path"]
        manifest_bytes = sum(
            os.path.getsize(os.path.join(b, f))
            for b, _d, fs in os.walk(path)
            for f in fs
            if not f.endswith(".zst") and f != "build.json"
        )
        cache = str(ctx.data / "cache" / f"scale-{n}")

        def one(_tool: str, _r: int, path: str = path, cache: str = cache) -> dict[str, Any]:
            return runner(ctx, {"data": path, "cache_dir": cache}, timeout=300)

        both = alternate(ctx, ["ferry"], one, what=f"scaling {n} shards")["ferry"]
        runs = {"startup": both, "resume": both}
        rows.append(
            {
                "shards": n,
                "tokens": n * TINY_DOCS * (DOC_TOKENS + 1),
                "manifest_bytes": manifest_bytes,
                "build_s": made.get("build_s", 0.0),
                "startup": runs["startup"],
                "resume": runs["resume"],
            }
        )
        log(f"scaling {n}: done")
    return {"sizes": rows}
