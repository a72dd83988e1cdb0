"""Runner: the limit of a loader that reads each sample's media with one small ranged GET — bare ranged GETs of
``length`` bytes at random offsets of one object, ``threads`` in flight, through the proxy (ferry's venv)."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import s3fs
from _common import args, emit, now

if __name__ == "__main__":
    a = args()
    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": a["endpoint"]}, skip_instance_cache=True
    )
    size, length = fs.size(a["object"]), int(a["length"])
    rng = random.Random(a.get("seed", 0))
    offsets = [rng.randrange(0, max(1, size - length)) for _ in range(int(a["gets"]))]
    fs.cat_file(a["object"], start=0, end=length)  # the connection set up before the clock
    t0 = now()
    with ThreadPoolExecutor(int(a["threads"])) as pool:
        got = sum(len(b) for b in pool.map(lambda o: fs.cat_file(a["object"], start=o, end=o + length), offsets))
    seconds = now() - t0
    emit({"gets_per_s": len(offsets) / seconds, "bytes": got, "seconds": seconds, "threads": a["threads"]})
