"""A small pre-tokenized Parquet corpus for packing tests (deterministic per seed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def parquet_corpus(tmp_path: Path, *, files: int, docs: int, seed: int) -> list[str]:
    """``files`` Parquet files of ``docs`` documents each (1–299 uint16 ids below 50,000)."""
    rng = np.random.default_rng(seed)
    paths = []
    for f in range(files):
        lists = [rng.integers(0, 50_000, size=int(rng.integers(1, 300))).tolist() for _ in range(docs)]
        path = tmp_path / f"in-{f}.parquet"
        pq.write_table(pa.table({"tokens": pa.array(lists, type=pa.list_(pa.uint16()))}), path)
        paths.append(str(path))
    return paths


def shard_bytes(root: Path) -> dict[str, bytes]:
    """Every shard file of the dataset at ``root`` by name."""
    return {p.name: p.read_bytes() for p in (root / "shards").iterdir()}
