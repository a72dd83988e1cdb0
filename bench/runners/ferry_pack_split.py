"""Runner: ``ferry.shard_tools.pack`` of one large input file (JSON Lines with a tokenizer, or Parquet
token ids), which ferry splits into sub-units for its workers (ferry's venv)."""

from __future__ import annotations

import shutil

import numpy as np
from _common import args, emit, now

import ferry.shard_tools.sources.split as split
from ferry.shard_tools import PackOptions, open_dataset, pack
from ferry.shard_tools.packer.packing import _prepare


def shards_without_split(out: str, shard_size: int) -> int:
    """How many shards the same documents make as one unit: the cutter's rule (raw bytes =
    tokens incl. EOS x item size + 4 per document, cut once it reaches the shard size) over
    the whole stream instead of per sub-unit."""
    ds = open_dataset(out)
    itemsize = np.dtype(ds.manifest.token_dtype).itemsize
    lengths = np.concatenate([np.diff(ds.read_shard(i).offsets) for i in range(len(ds))])
    cost = np.cumsum(lengths * itemsize + 4)
    shards, base, pos = 0, 0, 0
    while pos < len(cost):
        pos = int(np.searchsorted(cost, base + shard_size, side="left")) + 1
        base = int(cost[min(pos, len(cost)) - 1])
        shards += 1
    return shards


def main() -> None:
    a = args()
    if a.get("min_split") is not None:  # --quick: cut a small file too (planning runs in this process)
        split.MIN_SPLIT_BYTES = int(a["min_split"])
    shutil.rmtree(a["out"], ignore_errors=True)
    opts = PackOptions(
        name="split",  # not the output directory's name: every case publishes the same version id
        tokenizer=a.get("tokenizer"),
        vocab_size=a.get("vocab_size"),
        eos_id=a.get("eos_id"),
        compression_level=a["level"],
        workers=a["workers"],
        shard_size=a["shard_size"],
        progress=False,
    )
    units = len(_prepare(a["inputs"], a["out"], opts).units)
    t0 = now()
    res = pack(a["inputs"], a["out"], opts)
    seconds = now() - t0
    result: dict[str, object] = {
        "seconds": seconds,
        "units": units,
        "shards": res.shards,
        "tokens": res.tokens,
        "documents": res.documents,
        "raw_bytes": res.raw_bytes,
        "version_id": res.version_id,
    }
    if a.get("count_unsplit"):
        result["shards_without_split"] = shards_without_split(a["out"], a["shard_size"])
    emit(result)


if __name__ == "__main__":
    main()
