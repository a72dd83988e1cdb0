"""A loader's batches do not import ``numpy.ma``, which numpy 2's ``np.unique`` imports on its first call:
that import would land inside the training loop's first epoch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from scripts.loader_common import pack_test_dataset

from ferry.client.sampling.partition import distinct

_EPOCHS = """
import sys
from ferry.client import TokenDataset, TokenLoader
before = set(sys.modules)
ds = TokenDataset(sys.argv[1], seq_len=64, seed=3, shuffle=sys.argv[2], cache_dir=sys.argv[3])
loader = TokenLoader(ds, batch_size=7, num_workers=0)
count = 0
for _ in range(3):  # three epochs: the stream runs on, so some batches span two epochs
    for _batch in loader:
        count += 1
print(count, " ".join(sorted(set(sys.modules) - before)))
"""


def test_batches_across_epochs_do_not_import_numpy_ma(tmp_path: Path) -> None:
    url = pack_test_dataset(str(tmp_path / "ds"), n_docs=300)
    for shuffle in ("global", "window"):
        done = subprocess.run(
            [sys.executable, "-c", _EPOCHS, url, shuffle, str(tmp_path / f"cache-{shuffle}")],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        count, *imported = done.stdout.split()
        assert int(count) > 3
        assert "numpy.ma" not in imported, imported


def test_distinct_gives_each_value_once_ascending() -> None:
    assert distinct(np.array([5, 1, 5, 3, 1], dtype=np.int64)) == [1, 3, 5]
    assert distinct(np.array([], dtype=np.int64)) == []
    assert all(type(v) is int for v in distinct(np.array([2, 2], dtype=np.int64)))
