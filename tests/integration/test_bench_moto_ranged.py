"""The benchmark's S3 server (``bench/moto_ranged.py``): moto whose ranged GETs read only their range must
still answer every read exactly as moto does, so the remote benchmark times the loaders on correct bytes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import s3fs

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from netem import moto_server  # noqa: E402


@pytest.mark.parametrize("ranged", [True, False], ids=["ranged", "as-shipped"])
def test_reads_answer_the_same_bytes(ranged: bool) -> None:
    data = os.urandom((3 << 20) + 17)
    with moto_server(ranged=ranged) as endpoint:
        fs = s3fs.S3FileSystem(
            key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}, skip_instance_cache=True
        )
        fs.mkdir("bench-ranged")
        fs.pipe_file("bench-ranged/object", data)
        assert fs.cat_file("bench-ranged/object") == data
        assert fs.info("bench-ranged/object")["size"] == len(data)
        for start, end in [(0, 1), (100, 5000), (1 << 20, (2 << 20) + 3), (len(data) - 10, None), (5, len(data) + 99)]:
            assert fs.cat_file("bench-ranged/object", start=start, end=end) == data[start:end], (start, end)
        with pytest.raises(OSError):  # a range past the end: 416, as from moto itself
            fs.cat_file("bench-ranged/object", start=len(data) + 10, end=len(data) + 20)
        fs.pipe_file("bench-ranged/empty", b"")
        assert fs.cat_file("bench-ranged/empty") == b""
