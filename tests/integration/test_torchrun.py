"""A real multi-process run: torchrun --nproc_per_node 2 (gloo, CPU), then resumed on one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port
from scripts.loader_common import pack_test_dataset

from ferry.client import TokenDataset, TokenLoader

HERE = Path(__file__).resolve().parents[1]
SCRIPT = HERE / "scripts" / "loader_torchrun.py"


def torchrun(nproc: int, *args: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(HERE.parent), "OMP_NUM_THREADS": "1"}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(SCRIPT), *args,
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.slow
def test_torchrun_two_ranks_then_resume_on_one(tmp_path: Path) -> None:
    url = pack_test_dataset(str(tmp_path / "ds"), 400)
    cache = str(tmp_path / "cache")
    steps, batch = 20, 4  # 2 ranks x 4 = 8 per step; 40 steps x 8 = 320 samples: past the epoch end (268)
    torchrun(2, url, cache, str(tmp_path / "run"), str(batch), str(steps))
    r0, r1 = np.load(tmp_path / "run" / "rank0.npy"), np.load(tmp_path / "run" / "rank1.npy")
    flat0, flat1 = r0.reshape(-1, 64), r1.reshape(-1, 64)
    assert not ({row.tobytes() for row in flat0} & {row.tobytes() for row in flat1})  # disjoint ranks
    state = json.loads((tmp_path / "run" / "state.json").read_text())
    assert state["epoch"] * 268 + state["consumed"] == steps * 2 * batch

    torchrun(1, url, cache, str(tmp_path / "resumed"), str(2 * batch), str(steps), str(tmp_path / "run" / "ckpt"))
    resumed = np.load(tmp_path / "resumed" / "rank0.npy").reshape(-1, 64)

    ds = TokenDataset(url, seq_len=64, seed=21, shuffle="global", cache_dir=cache)
    assert ds.num_samples == 268
    reference = np.concatenate(
        [b["input_ids"].numpy() for _, b in zip(range(2 * steps), _forever(ds, 2 * batch), strict=False)]
    )
    interleaved = np.concatenate([np.concatenate([a, b]) for a, b in zip(r0, r1, strict=True)])
    np.testing.assert_array_equal(np.concatenate([interleaved, resumed]), reference)


def _forever(ds: TokenDataset, batch: int):  # type: ignore[no-untyped-def]
    loader = TokenLoader(ds, batch, rank=0, world_size=1)
    while True:
        yield from loader
