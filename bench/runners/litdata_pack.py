"""Runner: ``litdata.optimize`` with ``TokensLoader`` and zstd, as litdata documents for LLM pretraining
(one token tensor per document; the loader cuts blocks at read time). Peers' venv."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pyarrow.parquet as pq
import torch
from _common import args, dir_bytes, emit, now
from litdata import TokensLoader, optimize


def _documents(path: str) -> Iterator[object]:
    col = pq.read_table(path, columns=["tokens"]).column("tokens").combine_chunks()
    values = torch.from_numpy(col.values.to_numpy().copy())  # writable: torch warns otherwise
    offsets = col.offsets.to_numpy()
    eos = torch.tensor([EOS], dtype=values.dtype)
    for i in range(len(offsets) - 1):
        # EOS per document, as every packer here does
        yield torch.cat([values[offsets[i] : offsets[i + 1]], eos])


EOS = 0


def main() -> None:
    global EOS
    a = args()
    EOS = a["eos_id"]
    shutil.rmtree(a["out"], ignore_errors=True)
    t0 = now()
    optimize(
        fn=_documents,
        inputs=list(a["inputs"]),
        output_dir=a["out"],
        chunk_bytes=a["shard_size"],
        item_loader=TokensLoader(),
        compression=f"zstd:{a['level']}",
        compression_level="chunk",  # 0.2.76: TokensLoader needs whole-chunk zstd
        num_workers=a["workers"],
        reorder_files=False,
        verbose=False,
        start_method="fork",
    )
    seconds = now() - t0
    emit({"seconds": seconds, "output_bytes": dir_bytes(a["out"])})


if __name__ == "__main__":
    main()
