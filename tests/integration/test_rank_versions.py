"""Ranks of a real torchrun job (2 ranks, gloo) read one dataset version: rank 0's, or all fail, in bounded time.

Two replicas of each dataset stand at different versions (the second one appended), and the ranks are given
different replica lists, as when a version is published while the ranks start or a daemon still fills one.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import free_port
from scripts.loader_common import pack_test_dataset
from scripts.versions_torchrun import BATCH, TIMEOUT_S

from ferry.client import TokenDataset, TokenLoader

HERE = Path(__file__).resolve().parents[1]
SCRIPT = HERE / "scripts" / "versions_torchrun.py"


def _two_versions(root: Path, name: str, seed: int) -> tuple[str, str, str, str]:
    """``old`` at version 1 only, ``new`` at version 2 (version 1 appended to, both readable there)."""
    new, old = str(root / f"{name}-new"), str(root / f"{name}-old")
    pack_test_dataset(new, 300, seed=seed)
    shutil.copytree(new, old)
    pack_test_dataset(new, 100, seed=seed + 1, append=True)
    v1 = TokenDataset(old, seq_len=64, cache_dir=str(root / "probe")).version_id
    v2 = TokenDataset(new, seq_len=64, cache_dir=str(root / "probe")).version_id
    assert v1 != v2
    return old, new, v1, v2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("versions")
    a_old, a_new, v1, v2 = _two_versions(root, "a", 0)
    d_old, d_new, d1, d2 = _two_versions(root, "d", 10)
    config = {
        "cache": str(root / "cache"),
        "v1": v1,
        "pinned": [[a_new], [a_new]],
        "agree": [[a_old], [a_new]],
        "mixed": [[[a_old], [d_new]], [[a_new], [d_old, d_new]]],
        "missing": [[a_new], [a_old]],
        "silent": [[a_new], []],
    }
    (root / "config.json").write_text(json.dumps(config))
    out = root / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
        "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
        str(SCRIPT), str(root / "config.json"), str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return {"ranks": ranks, "out": out, "config": config, "v1": v1, "v2": v2, "d2": d2}


def _interleaved(out: Path, scenario: str) -> np.ndarray:
    r0, r1 = np.load(out / f"{scenario}-rank0.npy"), np.load(out / f"{scenario}-rank1.npy")
    return np.concatenate([np.concatenate([a, b]) for a, b in zip(r0, r1, strict=True)])


def _reference(ds: Any, batches: int) -> np.ndarray:
    """The first ``batches`` global batches of the stream, read by one process."""
    loader = TokenLoader(ds, 2 * BATCH, rank=0, world_size=1)
    return np.concatenate([b["input_ids"].numpy() for _, b in zip(range(batches), loader, strict=False)])


@pytest.mark.slow
def test_every_rank_reads_rank0s_version_and_the_epoch_is_an_exact_partition(run: dict[str, Any]) -> None:
    r0, r1 = (r["agree"] for r in run["ranks"])
    assert "error" not in r0 and "error" not in r1, (r0, r1)
    assert r0["version"] == r1["version"] == run["v1"]  # rank 1 saw version 2 first, and re-opened at 1
    n = r0["samples"]
    assert len(r0["ids"]) == len(r1["ids"]) >= n // 2
    epoch0 = _epoch0_ids(r0["ids"], r1["ids"], n)
    np.testing.assert_array_equal(np.sort(epoch0), np.arange(n))
    cache = run["config"]["cache"]
    ds = TokenDataset(run["config"]["agree"][0], seq_len=64, seed=5, cache_dir=cache)
    rows = _interleaved(run["out"], "agree")
    np.testing.assert_array_equal(rows, _reference(ds, len(rows) // (2 * BATCH)))


def _epoch0_ids(ids0: list[int], ids1: list[int], n: int) -> np.ndarray:
    """The sample ids both ranks read at stream positions below ``n`` (rank r reads ``[kG + rB, kG + rB + B)``)."""
    out = []
    for r, ids in enumerate((ids0, ids1)):
        for k in range(len(ids) // BATCH):
            start = k * 2 * BATCH + r * BATCH
            take = max(0, min(BATCH, n - start))
            out.extend(ids[k * BATCH : k * BATCH + take])
    return np.asarray(out)


@pytest.mark.slow
def test_each_source_of_a_mixture_agrees_on_rank0s_version(run: dict[str, Any]) -> None:
    r0, r1 = (r["mixed"] for r in run["ranks"])
    assert "error" not in r0 and "error" not in r1, (r0, r1)
    assert r0["versions"] == r1["versions"] == [run["v1"], run["d2"]]
    cache = run["config"]["cache"]
    first, second = run["config"]["mixed"][0]
    mix = TokenDataset.mix([TokenDataset(u, seq_len=64, seed=5, cache_dir=cache) for u in (first, second)], [1, 1])
    rows = _interleaved(run["out"], "mixed")
    np.testing.assert_array_equal(rows, _reference(mix, len(rows) // (2 * BATCH)))


@pytest.mark.slow
def test_a_rank_without_rank0s_version_fails_on_every_rank_naming_both(run: dict[str, Any]) -> None:
    for rank, result in enumerate(r["missing"] for r in run["ranks"]):
        assert result.get("error") == "DatasetError", (rank, result)
        message = result["message"]
        assert run["v1"] in message and run["v2"] in message and "rank 1" in message, message
        assert result["elapsed_s"] < 3 * TIMEOUT_S  # bounded: the ranks did not wait on each other for long


@pytest.mark.slow
def test_a_rank_that_never_answers_is_named_after_the_timeout(run: dict[str, Any]) -> None:
    result = run["ranks"][0]["silent"]
    assert result.get("error") == "DatasetError", result
    assert "rank 1" in result["message"] and "did not answer" in result["message"], result["message"]
    assert result["elapsed_s"] < 3 * TIMEOUT_S


@pytest.mark.slow
def test_pinned_or_opted_out_datasets_skip_the_agreement(run: dict[str, Any]) -> None:
    result = run["ranks"][1]["pinned"]
    assert result.get("versions") == [run["v1"], run["v2"]], result  # rank 0 built neither: nothing waited
