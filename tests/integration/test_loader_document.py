"""Document mode (pad/truncate with attention_mask; the contract every source keeps, tests/contracts/sources.py)
and document boundaries in token mode."""

from __future__ import annotations

import numpy as np
import pytest
from contracts.sources import Make, SampleSourceContract
from scripts.loader_common import EOS, make_documents, pack_test_dataset, token_stream

from ferry.client import TokenDataset, TokenLoader
from ferry.client.source import SampleSource
from ferry.client.stream.reader import IGNORE_INDEX
from ferry.shard_tools.errors import UsageError

N_DOCS = 120


@pytest.fixture(scope="module")
def url_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("docs")
    return pack_test_dataset(str(root / "ds"), N_DOCS, seed=4), str(root / "cache")


def test_document_mode_pads_and_truncates_with_an_attention_mask(url_cache: tuple[str, str]) -> None:
    url, cache = url_cache
    seq = 32
    docs = [np.append(d, EOS) for d in make_documents(N_DOCS, 4)]  # as stored: EOS appended
    ds = TokenDataset(url, seq_len=seq, seed=8, mode="document", cache_dir=cache, pad_id=7)
    assert ds.num_samples == N_DOCS
    loader = TokenLoader(ds, batch_size=5, rank=0, world_size=1)
    batches = list(loader)
    ids = ds.sample_ids(np.arange(N_DOCS))
    assert sorted(ids.tolist()) == list(range(N_DOCS))
    inputs = np.concatenate([b["input_ids"].numpy() for b in batches])[:N_DOCS]
    labels = np.concatenate([b["labels"].numpy() for b in batches])[:N_DOCS]
    mask = np.concatenate([b["attention_mask"].numpy() for b in batches])[:N_DOCS]
    saw_short = saw_long = False
    for row, d in enumerate(ids.tolist()):
        t = docs[d][: seq + 1]
        n = len(t) - 1
        saw_short |= n < seq
        saw_long |= len(docs[d]) > seq + 1
        np.testing.assert_array_equal(inputs[row, :n], t[:-1])
        np.testing.assert_array_equal(labels[row, :n], t[1:])
        assert (inputs[row, n:] == 7).all() and (labels[row, n:] == IGNORE_INDEX).all()
        assert mask[row].tolist() == [1] * n + [0] * (seq - n)
    assert saw_short and saw_long


def test_doc_boundaries_give_cu_seqlens_and_position_ids(url_cache: tuple[str, str]) -> None:
    url, cache = url_cache
    seq = 64
    stream = token_stream(url)
    doc_starts = set(np.nonzero(stream == EOS)[0] + 1)  # a document starts after every EOS
    ds = TokenDataset(url, seq_len=seq, seed=1, cache_dir=cache)
    loader = TokenLoader(ds, batch_size=4, rank=0, world_size=1, return_doc_boundaries=True)
    batch = next(iter(loader))
    ids = ds.sample_ids(np.arange(4))
    cu = batch["cu_seqlens"].tolist()
    assert str(batch["cu_seqlens"].dtype) == "torch.int32" and cu[0] == 0 and cu[-1] == 4 * seq
    expected = [0]
    for row, i in enumerate(ids.tolist()):
        inner = sorted(p - i * seq for p in doc_starts if i * seq < p < i * seq + seq)
        expected += [row * seq + c for c in inner] + [(row + 1) * seq]
        pos = batch["position_ids"][row].numpy()
        cuts = [0, *inner, seq]
        for a, b in zip(cuts[:-1], cuts[1:], strict=True):
            np.testing.assert_array_equal(pos[a:b], np.arange(b - a))
    assert cu == expected
    assert len(cu) > 4 + 1  # the samples do hold several documents


def test_boundaries_need_token_mode(url_cache: tuple[str, str]) -> None:
    url, cache = url_cache
    ds = TokenDataset(url, seq_len=16, mode="document", cache_dir=cache)
    with pytest.raises(UsageError, match="return_doc_boundaries"):
        TokenLoader(ds, 4, rank=0, world_size=1, return_doc_boundaries=True)
    with pytest.raises(UsageError, match="mode"):
        TokenDataset(url, seq_len=16, mode="chars", cache_dir=cache)
    with pytest.raises(UsageError, match="shuffle"):
        TokenDataset(url, seq_len=16, shuffle="random", cache_dir=cache)


class TestTokenDatasetDocuments(SampleSourceContract):
    mode = "document"
    seq = 32
    pad = 7

    @pytest.fixture
    def make(self, url_cache: tuple[str, str]) -> Make:
        url, cache = url_cache
        return lambda seed: TokenDataset(
            url, seq_len=self.seq, seed=seed, mode="document", cache_dir=cache, pad_id=self.pad
        )

    def expected(self, source: SampleSource, positions: np.ndarray) -> dict[str, np.ndarray]:
        assert isinstance(source, TokenDataset)
        docs = [np.append(d, EOS) for d in make_documents(N_DOCS, 4)]  # as stored: EOS appended
        rows = {k: np.full((len(positions), self.seq), fill) for k, fill in
                (("input_ids", self.pad), ("labels", IGNORE_INDEX), ("attention_mask", 0))}  # fmt: skip
        for row, d in enumerate(source.sample_ids(positions).tolist()):
            t = docs[d][: self.seq + 1]
            n = len(t) - 1
            rows["input_ids"][row, :n], rows["labels"][row, :n], rows["attention_mask"][row, :n] = t[:-1], t[1:], 1
        return rows
