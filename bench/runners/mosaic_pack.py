"""Runner: MosaicML ``MDSWriter`` (``ndarray:uint16``, zstd) as llm-foundry prepares pretraining data:
documents + EOS concatenated and cut into fixed ``seq_len + 1`` samples. MDSWriter is single-process;
with ``workers > 1`` each process writes its files into a subdirectory and ``merge_index`` joins them,
as mosaic's docs show for parallel conversion. Peers' venv."""

from __future__ import annotations

import multiprocessing
import os
import shutil

import numpy as np
import pyarrow.parquet as pq
from _common import args, dir_bytes, emit, now
from streaming import MDSWriter
from streaming.base.util import merge_index


def _write(job: tuple[list[str], str, dict]) -> int:
    files, out, a = job
    window = a["seq_len"] + 1
    carry = np.zeros(0, dtype=np.uint16)
    samples = 0
    with MDSWriter(
        out=out,
        columns={"tokens": "ndarray:uint16"},
        compression=f"zstd:{a['level']}",
        size_limit=a["shard_size"],
    ) as writer:
        for path in files:
            col = pq.read_table(path, columns=["tokens"]).column("tokens").combine_chunks()
            values = col.values.to_numpy()
            offsets = col.offsets.to_numpy()
            stream = np.insert(values, offsets[1:], np.uint16(a["eos_id"]))
            stream = np.concatenate([carry, stream])
            full = len(stream) // window
            for row in stream[: full * window].reshape(full, window):
                writer.write({"tokens": row})
            samples += full
            carry = stream[full * window :]
    return samples


def main() -> None:
    a = args()
    shutil.rmtree(a["out"], ignore_errors=True)
    inputs = list(a["inputs"])
    t0 = now()
    if a["workers"] == 1:
        _write((inputs, a["out"], a))
    else:
        nw = min(a["workers"], len(inputs))
        subs = [os.path.join(a["out"], str(w)) for w in range(nw)]
        jobs = [(inputs[w::nw], subs[w], a) for w in range(nw)]
        with multiprocessing.get_context("fork").Pool(nw) as pool:
            pool.map(_write, jobs, chunksize=1)
        # fork workers only: the parent already imported streaming and torch
        merge_index(a["out"], keep_local=True)  # joins every subdirectory's index.json
    seconds = now() - t0
    emit({"seconds": seconds, "output_bytes": dir_bytes(a["out"])})


if __name__ == "__main__":
    main()
