"""Runner: the packing limit — read the Parquet token column and zstd-compress its raw uint16 values.

No format, no digest, no per-document work: what any packer must at least do. ``workers``
processes each take every ``workers``-th file.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil

import pyarrow.parquet as pq
import zstandard
from _common import args, dir_bytes, emit, now

CHUNK = 64 * 2**20


def _one(job: tuple[str, str, int]) -> int:
    src, dst, level = job
    col = pq.read_table(src, columns=["tokens"]).column("tokens").combine_chunks()
    data = memoryview(col.values.to_numpy()).cast("B")
    comp = zstandard.ZstdCompressor(level=level)
    written = 0
    with open(dst, "wb") as f:
        for i in range(0, len(data), CHUNK):
            written += f.write(comp.compress(data[i : i + CHUNK]))
    return written


def main() -> None:
    a = args()
    shutil.rmtree(a["out"], ignore_errors=True)
    os.makedirs(a["out"])
    jobs = [(p, os.path.join(a["out"], f"{i}.zst"), a["level"]) for i, p in enumerate(a["inputs"])]
    t0 = now()
    if a["workers"] == 1:
        for job in jobs:
            _one(job)
    else:
        with multiprocessing.get_context("fork").Pool(a["workers"]) as pool:
            pool.map(_one, jobs, chunksize=1)
    seconds = now() - t0
    emit({"seconds": seconds, "output_bytes": dir_bytes(a["out"])})


if __name__ == "__main__":
    main()
