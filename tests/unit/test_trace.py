"""Provenance: ``ferry trace`` names, for every sample of a step, the documents (and input lines) it was cut from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ferry.client import TokenDataset, TokenLoader
from ferry.client.stream.trace import main
from ferry.shard_tools.cli import main as ferry
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.sources.tokenizer import ByteTokenizer

EOS = 256


def _corpus(path: Path, n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["ferry", "river", "boat", "data", "token", "crossing", "tide", "dock"]
    texts = [" ".join(rng.choice(words, size=int(rng.integers(3, 25)))) for _ in range(n)]
    with open(path, "w") as f:
        for i, t in enumerate(texts):
            f.write(json.dumps({"text": t}) + "\n")
            if i % 7 == 3:
                f.write("\n")  # blank lines: a document's line is not its index
    return texts


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], str, dict[str, dict[int, str]]]:
    root = tmp_path_factory.mktemp("trace")
    urls, lines = [], {}
    for i in range(2):
        src = root / f"in{i}.jsonl"
        _corpus(src, 120, seed=i)
        out = str(root / f"ds{i}")
        assert ferry(["pack", str(src), "--out", out, "--tokenizer", "bytes", "--shard-size", "4KiB"]) == 0
        urls.append(out)
        lines[str(src)] = {k: json.loads(t)["text"] for k, t in enumerate(src.read_text().split("\n"), 1) if t}
    return urls, str(root / "cache"), lines


def _check_step(records: list[dict[str, Any]], rows: np.ndarray, lines: dict[str, dict[int, str]]) -> None:
    """Each sample's tokens are the concatenation of its documents' re-tokenized text (plus EOS), sliced."""
    tok = ByteTokenizer()
    assert len(records) == len(rows)
    for rec, row in zip(records, rows, strict=True):
        parts = []
        for d in rec["documents"]:
            text = lines[d["file"]][d["row"]]
            doc = np.append(tok.encode_batch([text])[0].astype(np.int64), EOS)
            parts.append(doc[d["doc_tokens"][0] : d["doc_tokens"][1]])
        assert np.array_equal(np.concatenate(parts), row), rec


def test_trace_of_a_state_names_documents_whose_text_is_the_samples_tokens(
    packed: tuple[list[str], str, dict[str, dict[int, str]]], tmp_path: Path, capsys: Any
) -> None:
    urls, cache, lines = packed
    dss = [TokenDataset(u, seq_len=32, seed=i, cache_dir=cache) for i, u in enumerate(urls)]
    mixed = TokenDataset.mix(dss, [2, 1])
    loader = TokenLoader(mixed, 8, rank=0, world_size=1)
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    nxt = next(it)
    del it
    windows = mixed.payload(np.arange(40, 48))["windows"].astype(np.int64)
    assert np.array_equal(windows[:, :-1], nxt["input_ids"].numpy())
    (tmp_path / "s.json").write_text(json.dumps(state))
    assert main(["--state", str(tmp_path / "s.json"), "--global-batch", "8", "--cache-dir", cache, "--json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [r["position"] for r in records] == list(range(40, 48))
    assert {r["dataset_version"] for r in records} <= {d.version_id for d in dss}
    _check_step(records, windows, lines)
    # the same through the loader, and in text form
    assert loader.trace(np.arange(40, 48)) == records
    assert main(["--state", str(tmp_path / "s.json"), "--global-batch", "8", "--cache-dir", cache]) == 0
    text = capsys.readouterr().out
    assert "global sample 40: source " in text and ".jsonl:" in text


def test_trace_of_seed_config_step_and_rank(
    packed: tuple[list[str], str, dict[str, dict[int, str]]], capsys: Any
) -> None:
    urls, cache, lines = packed
    ds = TokenDataset(urls[0], seq_len=16, seed=7, shuffle="window", window=2, cache_dir=cache)
    args = ["--data", urls[0], "--seed", "7", "--seq-len", "16", "--shuffle", "window", "--window", "2"]
    args += ["--cache-dir", cache, "--step", "3", "--global-batch", "6", "--rank", "1", "--batch-size", "3", "--json"]
    assert main(args) == 0
    records = json.loads(capsys.readouterr().out)
    positions = np.arange(3 * 6 + 3, 3 * 6 + 6)
    assert [r["position"] for r in records] == positions.tolist()
    _check_step(records, ds.payload(positions)["windows"].astype(np.int64), lines)
    loader = TokenLoader(ds, 3, rank=1, world_size=2)
    assert loader.trace(step=3) == records


def test_document_mode_and_a_dataset_without_origin(tmp_path: Path, capsys: Any) -> None:
    from scripts.loader_common import pack_test_dataset

    url = pack_test_dataset(str(tmp_path / "old"), 30, seed=2)  # in-memory documents: no input file, no origin
    ds = TokenDataset(url, seq_len=16, seed=1, mode="document", cache_dir=str(tmp_path / "c"))
    (rec,) = TokenLoader(ds, 1, rank=0, world_size=1).trace([4])
    (doc,) = rec["documents"]
    assert "file" not in doc and doc["document"] == rec["sample"]
    stored = open_dataset(url).documents(strip_eos=False)
    tokens = list(stored)[rec["sample"]]
    assert doc["doc_tokens"] == [0, min(len(tokens), 17)]


def test_trace_errors_are_one_line(tmp_path: Path, capsys: Any) -> None:
    assert main(["--global-batch", "4", "--step", "1"]) == 2
    assert (
        main(["--data", str(tmp_path / "none"), "--seed", "1", "--seq-len", "8", "--step", "0", "--global-batch", "2"])
        == 1
    )
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(e.startswith("ferry trace: error: ") for e in err)
