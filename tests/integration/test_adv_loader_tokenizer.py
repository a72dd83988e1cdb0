"""A training job whose tokenizer cannot be the one its dataset was tokenized with is refused before the
first batch (``ferry.client.integrations.vocab``, which ``FerryDataLoader`` runs on torchtitan's tokenizer):
a vocabulary smaller than the dataset's, whose model embedding the dataset's ids would index past, or
another EOS id. Tokenizers here are real Hugging Face ``tokenizers`` word-level vocabularies, and one
that follows torchtitan's ``BaseTokenizer`` protocol (``get_vocab_size()``, ``eos_id``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from ferry.client import TokenDataset
from ferry.client.integrations.vocab import check_tokenizer
from ferry.shard_tools import PackOptions, pack_documents
from ferry.shard_tools.errors import UsageError

tokenizers = pytest.importorskip("tokenizers", reason="the tokenizers extra is not installed")

VOCAB = 300
EOS = VOCAB - 1


class TitanProtocol:
    """torchtitan's tokenizer protocol: what its Trainer hands a data loader as ``tokenizer``."""

    def __init__(self, vocab: int, eos_id: int | None) -> None:
        self.vocab, self.eos_id = vocab, eos_id

    def get_vocab_size(self) -> int:
        return self.vocab


def _word_level(n: int) -> Any:
    vocab = {f"w{i}": i for i in range(n)}
    return tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab=vocab, unk_token="w0"))


@pytest.fixture(scope="module")
def ds(tmp_path_factory: pytest.TempPathFactory) -> TokenDataset:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, EOS, size=int(rng.integers(10, 60))) for _ in range(50)]
    docs[0][0] = EOS - 1  # the largest id below EOS occurs
    url = str(tmp_path_factory.mktemp("tok") / "ds")
    pack_documents(docs, url, PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=1024, progress=False))
    return TokenDataset(url, seq_len=16, cache_dir=str(tmp_path_factory.mktemp("cache")))


def test_a_smaller_vocabulary_is_refused_naming_both_sizes(ds: TokenDataset) -> None:
    small = _word_level(VOCAB // 2)
    with pytest.raises(UsageError, match=rf"{VOCAB // 2} ids .* of {VOCAB}"):
        check_tokenizer(ds, small)
    # the harm it stands for: the dataset's ids index past an embedding sized by that tokenizer
    ids = torch.as_tensor(ds.batch(np.arange(len(ds)))["input_ids"])
    assert int(ids.max()) >= small.get_vocab_size()
    with pytest.raises(IndexError):
        torch.nn.Embedding(small.get_vocab_size(), 4)(ids)


def test_another_eos_id_is_refused(ds: TokenDataset) -> None:
    with pytest.raises(UsageError, match=rf"id 0 .* with {EOS}"):
        check_tokenizer(ds, TitanProtocol(VOCAB, eos_id=0))


@pytest.mark.parametrize(
    "tokenizer", [None, TitanProtocol(VOCAB, EOS), TitanProtocol(4 * VOCAB, None), TitanProtocol(VOCAB, None)]
)
def test_a_tokenizer_that_can_be_the_datasets_passes(ds: TokenDataset, tokenizer: Any) -> None:
    check_tokenizer(ds, tokenizer)
    check_tokenizer(ds, _word_level(VOCAB))
