"""Runner: the link's limit — bare parallel ranged GETs (s3fs, ``connections``
at a time, ``part_size`` each) of the same stored shards through the same proxy; nothing decoded."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import s3fs
from _common import args, emit, now


def main() -> None:
    a = args()
    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": a["endpoint"]}, skip_instance_cache=True
    )
    part = a.get("part_size", 8 << 20)
    jobs = [(path, off, min(off + part, size)) for path, size in a["objects"] for off in range(0, size, part)]
    t0 = now()
    with ThreadPoolExecutor(a.get("connections", 8)) as pool:
        got = sum(pool.map(lambda j: len(fs.cat_file(j[0], start=j[1], end=j[2])), jobs))
    seconds = now() - t0
    emit({"seconds": seconds, "bytes": got, "mb_per_s": got / seconds / 1e6, "tokens_per_s": a["tokens"] / seconds})


if __name__ == "__main__":
    main()
