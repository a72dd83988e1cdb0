"""Helpers shared by the loader tests and their torchrun scripts: small packed datasets and an oracle."""

from __future__ import annotations

import numpy as np

from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.packer.packing import PackOptions, pack_documents

VOCAB = 1000
EOS = 0


def make_documents(n_docs: int, seed: int = 0, mean_len: int = 40) -> list[np.ndarray]:
    """Documents of random length with ids in [1, VOCAB) (EOS=0 is appended at pack time)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 2 * mean_len, size=n_docs)
    return [rng.integers(1, VOCAB, size=int(n)).astype(np.int64) for n in lengths]


def pack_test_dataset(url: str, n_docs: int = 400, *, seed: int = 0, shard_size: int = 4096, **options: object) -> str:
    """Pack synthetic documents into ``url`` (small shards so that samples cross shard boundaries)."""
    opts = PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=shard_size, progress=False, **options)  # type: ignore[arg-type]
    pack_documents(make_documents(n_docs, seed), url, opts)
    return url


def token_stream(url: str, storage_options: dict | None = None) -> np.ndarray:
    """The dataset's whole token stream, read independently of the loader (the oracle)."""
    ds = open_dataset(url, storage_options=storage_options)
    docs = list(ds.documents(strip_eos=False))
    return np.concatenate(docs).astype(np.int64)
