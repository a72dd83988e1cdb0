"""Runner: ``ferry.shard_tools.pack`` on the Parquet corpus (ferry's venv)."""

from __future__ import annotations

import shutil

from _common import args, dir_bytes, emit, now, profiled

from ferry.shard_tools import PackOptions, pack


def main() -> None:
    a = args()
    shutil.rmtree(a["out"], ignore_errors=True)
    opts = PackOptions(
        vocab_size=a["vocab_size"],
        eos_id=a["eos_id"],
        compression_level=a["level"],
        workers=a["workers"],
        shard_size=a["shard_size"],
        progress=False,
    )

    def run() -> dict[str, object]:
        t0 = now()
        res = pack(a["inputs"], a["out"], opts)
        seconds = now() - t0
        return {"seconds": seconds, "shards": res.shards, "version_id": res.version_id}

    result = profiled(run) if a.get("profile") else run()
    result["output_bytes"] = dir_bytes(a["out"])
    emit(result)


if __name__ == "__main__":
    main()
