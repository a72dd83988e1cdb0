"""Runner: the limit of a loader that reads zstd shards — decompress every chunk of the raw uint16 token stream
into memory, then gather random ``seq_len + 1`` windows from it into int64 batches (as the memmap limit does).

The stream is cut into ``chunk_bytes`` chunks (64 MiB, as ferry's shards), each compressed at zstd ``level``
(1, as the packed datasets) once, untimed, into ``cache_dir``. The build decompresses them all, one thread, into
one array, so an ``epoch`` run times what any loader of zstd shards must do once per cold epoch: decompress,
then gather. No digest, no cache file, no format, no state beyond a counter.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import zstandard
from _loadloop import Tool, main
from memmap_load import MemmapLoader, _load


def _chunks(stream: str, out: str, chunk_bytes: int, level: int) -> list[str]:
    """The compressed chunks of ``stream`` in ``out`` (made once; a finished set has its ``done`` marker)."""
    os.makedirs(out, exist_ok=True)
    done = os.path.join(out, "done")
    if not os.path.exists(done):
        comp = zstandard.ZstdCompressor(level=level)
        with open(stream, "rb") as f:
            k = 0
            while chunk := f.read(chunk_bytes):
                with open(os.path.join(out, f"{k:05d}.zst"), "wb") as g:
                    g.write(comp.compress(chunk))
                k += 1
        open(done, "w").close()
    return sorted(os.path.join(out, n) for n in os.listdir(out) if n.endswith(".zst"))


class UnzstdLoader(MemmapLoader):
    """The memmap limit's batches, from the stream decompressed into memory at build time."""

    def __init__(self, a: dict[str, Any]) -> None:
        paths = _chunks(a["data"], os.path.join(a["cache_dir"], "chunks"), a.get("chunk_bytes", 64 << 20), 1)
        raw_bytes = os.path.getsize(a["data"])
        tokens = np.empty(raw_bytes // 2, dtype=np.uint16)
        view = memoryview(tokens).cast("B")
        dctx = zstandard.ZstdDecompressor()
        at = 0
        for path in paths:
            with open(path, "rb") as f, dctx.stream_reader(f) as reader:
                while (n := reader.readinto(view[at:])) > 0:
                    at += n
        if at != raw_bytes:
            raise SystemExit(f"decompressed {at} bytes, the stream has {raw_bytes}")
        super().__init__({**a, "tokens": tokens})


if __name__ == "__main__":
    main(
        Tool(
            build=UnzstdLoader,
            ids=lambda b: b,
            epoch_batches=len,
            state=lambda ld: {"pos": ld.pos},
            load_state=_load,
        )
    )
