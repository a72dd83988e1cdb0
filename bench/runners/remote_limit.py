"""Runner: the link's limit — bare parallel ranged GETs of the same stored shards through the same proxy; nothing
decoded, hashed or written.

Each layout of ``layouts`` (``[part_size, connections]``; default: ``part_size`` and ``connections`` alone)
reads every object once as ranged GETs of ``part_size`` bytes, ``connections`` in flight at once, as tasks on
s3fs's event loop; a GET of one byte opens the session before the clock starts (as a loader's first batch has
by the time its rate is measured). The result is the fastest layout's rate, each layout's beside it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import s3fs
from _common import args, cpu_seconds, emit, now


async def _all(fs: s3fs.S3FileSystem, jobs: list[tuple[str, int, int]], connections: int) -> int:
    gate = asyncio.Semaphore(connections)

    async def one(path: str, start: int, end: int) -> int:
        async with gate:
            return len(await fs._cat_file(path, start=start, end=end))

    return sum(await asyncio.gather(*(one(*j) for j in jobs)))


def _layout(fs: s3fs.S3FileSystem, objects: list[tuple[str, int]], part: int, connections: int) -> dict[str, Any]:
    jobs = [(path, off, min(off + part, size)) for path, size in objects for off in range(0, size, part)]
    t0, cpu0 = now(), cpu_seconds()
    got = asyncio.run_coroutine_threadsafe(_all(fs, jobs, connections), fs.loop).result()
    seconds, cpu = now() - t0, cpu_seconds() - cpu0
    return {"part_size": part, "connections": connections, "seconds": seconds, "bytes": got, "cpu_s": cpu}


def main() -> None:
    a = args()
    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": a["endpoint"]}, skip_instance_cache=True
    )
    objects = [(str(p), int(n)) for p, n in a["objects"]]
    fs.cat_file(objects[0][0], start=0, end=1)  # the session and a first connection, before any clock
    layouts = a.get("layouts") or [[a.get("part_size", 8 << 20), a.get("connections", 8)]]
    runs = [_layout(fs, objects, int(part), int(conns)) for part, conns in layouts]
    best = min(runs, key=lambda r: r["seconds"])
    emit(
        {
            **best,
            "mb_per_s": best["bytes"] / best["seconds"] / 1e6,
            "tokens": a["tokens"],
            "tokens_per_s": a["tokens"] / best["seconds"],
            "layouts": [{**r, "mb_per_s": r["bytes"] / r["seconds"] / 1e6} for r in runs],
        }
    )


if __name__ == "__main__":
    main()
