"""torchrun + DCP + a changing data plan: 2 ranks on a two-source mixture, resume on 1 rank with new
weights and a third source, resume again on 2 ranks — every source reads its own stream exactly once."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import torchrun
from scripts.loader_common import pack_test_dataset
from scripts.replan_common import mix, run

from ferry.client import TokenDataset
from ferry.client.sampling.schedule import Schedule

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "replan_train.py"
G = 8


def _torchrun(nproc: int, args: list[str]) -> None:
    torchrun(SCRIPT, nproc, args, timeout=240)


def _stream(out: Path) -> np.ndarray:
    """The global batches of every step, ranks in rank order, steps in order (each step exactly once)."""
    by_step: dict[int, dict[int, list[list[int]]]] = {}
    for f in out.glob("stream-rank*.jsonl"):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert rec["rank"] not in by_step.setdefault(rec["step"], {}), f"step {rec['step']} twice"
            by_step[rec["step"]][rec["rank"]] = rec["input_ids"]
    assert sorted(by_step) == list(range(len(by_step)))
    return np.asarray([row for s in sorted(by_step) for r in sorted(by_step[s]) for row in by_step[s][r]])


@pytest.mark.slow
def test_torchrun_replan_on_resume_with_dcp(tmp_path: Path) -> None:
    data = [pack_test_dataset(str(tmp_path / f"d{i}"), 70 + 20 * i, seed=i) for i in range(3)]
    out = tmp_path / "out"
    out.mkdir()
    common = ["--out", str(out), "--global-batch", str(G)]
    c1, c2, c3 = (str(tmp_path / f"ckpt{i}") for i in (1, 2, 3))
    _torchrun(2, [*common, "--data", *data[:2], "--weights", "1", "1", "--tag", "a", "--ckpt-out", c1, "--until", "3"])
    three = ["--data", *data, "--weights", "1", "2", "1"]
    _torchrun(1, [*common, *three, "--tag", "b", "--ckpt-in", c1, "--replan", "--ckpt-out", c2, "--until", "6"])
    _torchrun(2, [*common, *three, "--tag", "c", "--ckpt-in", c2, "--ckpt-out", c3, "--until", "9"])

    rows = _stream(out)
    assert rows.shape == (9 * G, 16)
    state = json.loads((out / "state-c.json").read_text())
    assert state["position"] == 9 * G and state["plan"]["anchor"] == 3 * G
    assert state["plan"]["phases"] == [[0, [1, 1, 0]], [3 * G, [1, 2, 1]]]
    assert json.loads((out / "state-b.json").read_text())["plan"] == state["plan"]  # the strict resume kept it

    sources = [TokenDataset(u, seq_len=16, seed=10 + i, cache_dir=str(tmp_path / "cache")) for i, u in enumerate(data)]
    # before the change: exactly the uninterrupted two-source run
    old = TokenDataset.mix(sources[:2], [1, 1])
    np.testing.assert_array_equal(rows[: 3 * G], old.batch(np.arange(3 * G))["input_ids"].numpy())
    # over the whole run: each source's rows are its own stream from the start, nothing repeated or skipped
    src, _ = Schedule([(s, q) for s, q in state["plan"]["phases"]]).locate(np.arange(9 * G))
    for j, d in enumerate(sources):
        mine = rows[src == j]
        assert len(mine) > 0
        np.testing.assert_array_equal(mine, d.batch(np.arange(len(mine)))["input_ids"].numpy(), err_msg=f"source {j}")


def test_workers_do_not_change_a_replanned_stream() -> None:
    """DataLoader worker processes (moved here from tests/unit/test_replan.py, which stays in-process)."""
    _, state = run(mix([0, 1], [1, 2]), None, 1, 3, 3)
    plain, _ = run(mix([1, 4], [1, 1]), state, 2, 2, 6, replan=True)
    forked, _ = run(mix([1, 4], [1, 1]), state, 2, 2, 6, replan=True, workers=2)
    assert forked == plain
