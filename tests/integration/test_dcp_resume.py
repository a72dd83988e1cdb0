"""torchrun + torch.distributed.checkpoint: stop on 4 ranks, resume on 2, same global stream.

``tests/scripts/dcp_train.py`` trains a tiny model over ``TokenLoader`` (gloo, CPU). The
reference is one plain process running every step. The elastic run trains ``STOP`` steps
under ``torchrun --nproc_per_node 4``, saves a DCP checkpoint (model, optimizer, loader as a
``Stateful``), then ``torchrun --nproc_per_node 2`` (one DataLoader worker per rank) loads it
and trains to the end. The global
batch of every step (the ranks' ``input_ids`` in rank order) must equal the reference's, the
run crosses an epoch boundary after the resume, and the final weights agree.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_group, torchrun

from ferry.shard_tools import PackOptions, pack_documents

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dcp_train.py"
STEPS = 8
STOP = 3
GLOBAL_BATCH = 8
SEQ_LEN = 16
VOCAB = 512


def _run(cmd: list[str]) -> None:
    run_group(cmd, timeout=180)


def _torchrun(nproc: int, args: list[str]) -> None:
    torchrun(SCRIPT, nproc, args, timeout=180)


def _global_stream(out: Path, tag: str) -> tuple[dict[int, list[list[int]]], dict[int, int]]:
    """step → the global batch (rows of input_ids), ranks concatenated in rank order; step → world size."""
    rows: dict[int, dict[int, list[list[int]]]] = {}
    worlds: dict[int, int] = {}
    for f in sorted(out.glob(f"stream-{tag}-rank*.jsonl")):
        for line in f.read_text().splitlines():
            rec: dict[str, Any] = json.loads(line)
            assert rec["rank"] not in rows.get(rec["step"], {}), f"step {rec['step']} written twice"
            rows.setdefault(rec["step"], {})[rec["rank"]] = rec["input_ids"]
            worlds[rec["step"]] = rec["world_size"]
    stream: dict[int, list[list[int]]] = {}
    for step, by_rank in rows.items():
        assert sorted(by_rank) == list(range(worlds[step])), f"step {step}: ranks {sorted(by_rank)}"
        stream[step] = [row for r in sorted(by_rank) for row in by_rank[r]]
    return stream, worlds


@pytest.mark.slow
def test_torchrun_4_ranks_checkpoint_resume_on_2_ranks(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    docs = [rng.integers(0, VOCAB - 1, size=int(rng.integers(5, 60))) for _ in range(30)]
    data = str(tmp_path / "data")
    pack_documents(docs, data, PackOptions(vocab_size=VOCAB, eos_id=VOCAB - 1, shard_size=1024))
    tokens = sum(len(d) + 1 for d in docs)
    samples = (tokens - 1) // SEQ_LEN
    assert STOP * GLOBAL_BATCH < samples < STEPS * GLOBAL_BATCH, "the resumed part must cross an epoch boundary"

    out = tmp_path / "out"
    out.mkdir()
    common = ["--data", data, "--out", str(out), "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH)]
    common += ["--seq-len", str(SEQ_LEN), "--vocab", str(VOCAB)]
    _run([sys.executable, str(SCRIPT), *common, "--ckpt", str(tmp_path / "unused"), "--tag", "ref"])
    ckpt = tmp_path / "ckpt"
    _torchrun(4, [*common, "--ckpt", str(ckpt), "--tag", "elastic", "--stop-after", str(STOP)])
    assert (ckpt / ".metadata").exists(), "DCP wrote no checkpoint"
    _torchrun(2, [*common, "--ckpt", str(ckpt), "--tag", "elastic", "--resume", "--workers", "1"])

    ref, _ = _global_stream(out, "ref")
    elastic, worlds = _global_stream(out, "elastic")
    assert worlds == {s: 4 if s < STOP else 2 for s in range(STEPS)}
    assert sorted(ref) == list(range(STEPS))
    assert sorted(elastic) == list(range(STEPS)), "a step is missing or repeated"
    for step in range(STEPS):
        assert len(ref[step]) == GLOBAL_BATCH
        assert elastic[step] == ref[step], f"global batch {step} differs after the 4 → 2 rank resume"
    # Each epoch is a permutation of the samples: the first `samples` positions hold no repeat.
    first_epoch = [tuple(r) for s in range(STEPS) for r in ref[s]][:samples]
    assert len(set(first_epoch)) == len(first_epoch)

    # The model and optimizer came back too: same math, so nearly the same weights.
    p_ref = json.loads((out / "params-ref.json").read_text())
    p_el = json.loads((out / "params-elastic.json").read_text())
    assert p_ref.keys() == p_el.keys()
    for k in p_ref:
        np.testing.assert_allclose(p_el[k], p_ref[k], rtol=1e-4, atol=1e-5, err_msg=k)
