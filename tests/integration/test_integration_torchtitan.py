"""torchtitan as a client: its Trainer, checkpointer and data-loader protocol over ``FerryDataLoader``.

The end-to-end test trains torchtitan's llama3 debug model on CPU (gloo) with
``tests/scripts/torchtitan_train.py``: an uninterrupted reference on 1 rank, and a run that
checkpoints after ``STOP`` steps on 2 data-parallel ranks through torchtitan's checkpointer
and resumes on 1 rank (with a DataLoader worker). The global batch of every step must be the
reference's, the resumed part crosses an epoch boundary, and the final weights agree.

Needs the ``torchtitan`` extra: ``make test`` runs this file a second time in ``.venv-titan``
(``requirements-titan.lock``), where it is installed; elsewhere the tests skip and say so.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import torchrun

from ferry.shard_tools import PackOptions, pack_documents
from ferry.shard_tools.errors import StateError, UsageError

if importlib.util.find_spec("torchtitan") is None:
    pytest.skip(
        "torchtitan is not installed here: `make test` runs this file in .venv-titan "
        "(requirements-titan.lock); elsewhere pip install 'ferry-data[torchtitan]'",
        allow_module_level=True,
    )

import torch  # noqa: E402

from ferry.client.integrations.torchtitan import FerryDataLoader  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "torchtitan_train.py"
VOCAB = 2048  # the debug model's vocabulary
SEQ_LEN = 32
GLOBAL_BATCH = 4
STEPS = 6
STOP = 3


def _pack(path: Path, n_docs: int = 12, seed: int = 7) -> tuple[str, int]:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, VOCAB - 1, size=int(rng.integers(20, 80))) for _ in range(n_docs)]
    pack_documents(docs, str(path), PackOptions(vocab_size=VOCAB, eos_id=VOCAB - 1, shard_size=1024, progress=False))
    tokens = sum(len(d) + 1 for d in docs)
    return str(path), (tokens - 1) // SEQ_LEN


def _loader(data: str, rank: int, world: int, **config: Any) -> FerryDataLoader:
    cfg = FerryDataLoader.Config(dataset_path=data, **{"seed": 3, **config})
    return cfg.build(dp_world_size=world, dp_rank=rank, seq_len=SEQ_LEN, local_batch_size=GLOBAL_BATCH // world)


def _take(it: Any, n: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    return [next(it) for _ in range(n)]


def test_batches_follow_torchtitans_protocol(tmp_path: Path) -> None:
    data, samples = _pack(tmp_path / "data")
    loader = _loader(data, rank=1, world=2)
    inputs, labels = next(iter(loader))
    assert set(inputs) == {"input", "positions"}
    assert inputs["input"].shape == labels.shape == (GLOBAL_BATCH // 2, SEQ_LEN)
    assert inputs["input"].dtype == labels.dtype == torch.int64
    assert torch.equal(inputs["input"][:, 1:], labels[:, :-1])
    pos = inputs["positions"]
    # positions restart at 0 where a document starts and count up by one inside it
    step = pos[:, 1:] - pos[:, :-1]
    assert bool(((step == 1) | (pos[:, 1:] == 0)).all()) and bool((pos[:, 0] == 0).all())
    plain = next(iter(_loader(data, rank=1, world=2, document_masks=False)))[0]
    assert torch.equal(plain["input"], inputs["input"])
    assert torch.equal(plain["positions"], torch.arange(SEQ_LEN).expand(GLOBAL_BATCH // 2, SEQ_LEN))


def test_runs_through_epochs_unless_finite(tmp_path: Path) -> None:
    data, samples = _pack(tmp_path / "data")
    per_epoch = -(-samples // GLOBAL_BATCH)
    endless = iter(_loader(data, rank=0, world=1))
    assert len(_take(endless, 3 * per_epoch)) == 3 * per_epoch
    finite = list(_loader(data, rank=0, world=1, infinite=False))
    assert len(finite) == per_epoch


def test_state_resumes_on_another_dp_degree(tmp_path: Path) -> None:
    data, samples = _pack(tmp_path / "data")
    ref = [b[0]["input"] for b in _take(iter(_loader(data, rank=0, world=1)), 8)]
    ranks = [_loader(data, rank=r, world=2) for r in range(2)]
    its = [iter(r) for r in ranks]
    for k in range(3):
        got = torch.cat([next(it)[0]["input"] for it in its])
        assert torch.equal(got, ref[k])
    states = [r.state_dict() for r in ranks]
    assert states[0] == states[1], "every rank must checkpoint the same state (DCP keeps one copy)"
    json.dumps(states[0])
    resumed = _loader(data, rank=0, world=1, num_workers=1)
    resumed.load_state_dict(states[0])
    rest = [b[0]["input"] for b in _take(iter(resumed), 5)]
    for k, batch in enumerate(rest, start=3):
        assert torch.equal(batch, ref[k]), f"batch {k} differs after the 2 → 1 resume"


def test_state_checks(tmp_path: Path) -> None:
    data, _ = _pack(tmp_path / "data")
    loader = _loader(data, rank=0, world=1)
    loader.load_state_dict({})  # torchtitan's fresh start
    assert loader.loader.position == 0
    with pytest.raises(StateError, match="torchtitan's own data loader"):
        loader.load_state_dict({"dp_rank_0": b"...", "world_size": 1})
    other = _loader(data, rank=0, world=1, seed=4)
    with pytest.raises(StateError, match="seed"):
        other.load_state_dict(loader.state_dict())
    lenient = _loader(data, rank=0, world=1, seed=4, strict_resume=False)
    lenient.load_state_dict(loader.state_dict())
    with pytest.raises(UsageError, match="dataset_path"):
        FerryDataLoader.Config().build(dp_world_size=1, dp_rank=0, seq_len=SEQ_LEN, local_batch_size=1)


def test_a_tokenizer_that_cannot_be_the_datasets_is_refused(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    data, _ = _pack(tmp_path / "data")
    small = tokenizers.Tokenizer(
        tokenizers.models.WordLevel(vocab={f"w{i}": i for i in range(VOCAB // 2)}, unk_token="w0")
    )
    build = {"dp_world_size": 1, "dp_rank": 0, "seq_len": SEQ_LEN, "local_batch_size": 1, "tokenizer": small}
    with pytest.raises(UsageError, match="check_tokenizer"):
        FerryDataLoader.Config(dataset_path=data).build(**build)
    unchecked = FerryDataLoader.Config(dataset_path=data, check_tokenizer=False).build(**build)
    assert next(iter(unchecked))[0]["input"].shape == (1, SEQ_LEN)


# ---------------------------------------------------------------- torchtitan's Trainer, end to end


def _torchrun(nproc: int, args: list[str]) -> None:
    torchrun(SCRIPT, nproc, args, timeout=400)


def _global_stream(out: Path, tag: str) -> tuple[dict[int, list[list[int]]], dict[int, int]]:
    """stream position of each global batch → its rows (ranks in rank order); → the world size."""
    rows: dict[int, dict[int, list[list[int]]]] = {}
    worlds: dict[int, int] = {}
    for f in sorted(out.glob(f"stream-{tag}-rank*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            assert rec["rank"] not in rows.get(rec["start"], {}), f"batch at {rec['start']} delivered twice"
            rows.setdefault(rec["start"], {})[rec["rank"]] = rec["input"]
            worlds[rec["start"]] = rec["world_size"]
    stream = {}
    for start, by_rank in rows.items():
        assert sorted(by_rank) == list(range(worlds[start])), f"batch at {start}: ranks {sorted(by_rank)}"
        stream[start] = [row for r in sorted(by_rank) for row in by_rank[r]]
    return stream, worlds


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_torchtitan_trains_checkpoints_and_resumes_on_another_dp_degree(tmp_path: Path) -> None:
    data, samples = _pack(tmp_path / "data")
    assert STOP * GLOBAL_BATCH < samples < STEPS * GLOBAL_BATCH, "the resumed part must cross an epoch boundary"
    out = tmp_path / "out"
    out.mkdir()
    common = ["--data", data, "--out", str(out), "--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH)]
    common += ["--seq-len", str(SEQ_LEN)]

    _torchrun(1, [*common, "--dump", str(tmp_path / "ref"), "--tag", "ref"])
    dump = tmp_path / "elastic"
    _torchrun(2, [*common, "--dump", str(dump), "--tag", "elastic", "--stop-after", str(STOP)])
    assert (dump / "checkpoint" / f"step-{STOP}").is_dir(), "torchtitan's checkpointer wrote no checkpoint"
    _torchrun(1, [*common, "--dump", str(dump), "--tag", "elastic", "--workers", "1"])

    ref, _ = _global_stream(out, "ref")
    elastic, worlds = _global_stream(out, "elastic")
    starts = [k * GLOBAL_BATCH for k in range(STEPS)]
    assert sorted(ref) == starts
    assert sorted(elastic) == starts, "a batch is missing or repeated"
    assert [worlds[s] for s in starts] == [2] * STOP + [1] * (STEPS - STOP)
    for s in starts:
        assert len(ref[s]) == GLOBAL_BATCH
        assert elastic[s] == ref[s], f"global batch at stream position {s} differs after the 2 → 1 resume"
    first_epoch = [tuple(r) for s in starts for r in ref[s]][:samples]
    assert len(set(first_epoch)) == len(first_epoch), "an epoch repeats a sample"

    # torchtitan restored the model and optimizer too: the same math, nearly the same weights
    p_ref = torch.load(out / "params-ref.pt")
    p_el = torch.load(out / "params-elastic.pt")
    assert p_ref.keys() == p_el.keys()
    for name in p_ref:
        torch.testing.assert_close(p_el[name], p_ref[name], rtol=1e-4, atol=1e-5, msg=name)
