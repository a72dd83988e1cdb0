"""The benchmark corpus: deterministic synthetic pre-tokenized documents, written once as Parquet.

Documents have log-normal lengths (median ~600 tokens) and Zipf-distributed token ids over a
GPT-2-sized vocabulary (uint16). The same seed and token count always give the same files, so
every packer reads the same input and a rerun reuses the cached corpus. Beside the Parquet files
we keep the raw token stream (documents + EOS, uint16) — the input of the memmap and zstd limits.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["Corpus", "CorpusSpec", "ensure_corpus"]

VOCAB_SIZE = 50257  # GPT-2: fits uint16
EOS_ID = 50256
MEDIAN_DOC_TOKENS = 600
SIGMA = 1.0  # log-normal spread of document lengths
ZIPF_S = 1.1
TOKENS_PER_FILE = 8_000_000


@dataclass(frozen=True)
class CorpusSpec:
    """What determines the corpus: change any field and a new corpus is generated."""

    tokens: int
    seed: int = 20261130
    vocab_size: int = VOCAB_SIZE
    eos_id: int = EOS_ID
    median_doc_tokens: int = MEDIAN_DOC_TOKENS
    zipf_s: float = ZIPF_S
    tokens_per_file: int = TOKENS_PER_FILE  # ferry puts each input file in shards of its own

    @property
    def key(self) -> str:
        per_file = "" if self.tokens_per_file == TOKENS_PER_FILE else f"-{self.tokens_per_file}pf"
        return f"corpus-{self.tokens}-{self.seed}{per_file}"


@dataclass(frozen=True)
class Corpus:
    """A generated corpus on disk."""

    root: Path
    files: list[str]  # Parquet inputs, in order
    stream: str  # raw uint16 token stream with EOS after each document
    documents: int
    tokens: int  # document tokens, EOS not counted
    stream_tokens: int  # tokens + one EOS per document
    spec: CorpusSpec

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["root"] = str(self.root)
        return d


def _zipf_cdf(vocab: int, s: float) -> np.ndarray:
    ranks = np.arange(1, vocab + 1, dtype=np.float64)
    weights = ranks**-s
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def _gen_file(spec: CorpusSpec, index: int, budget: int, cdf: np.ndarray, ids: np.ndarray) -> tuple[pa.Table, int]:
    """One file's documents: lengths first, then all token ids in one vectorised draw."""
    rng = np.random.default_rng([spec.seed, index])
    lengths: list[np.ndarray] = []
    total = 0
    while total < budget:
        draw = np.maximum(1, rng.lognormal(np.log(spec.median_doc_tokens), SIGMA, 4096).astype(np.int64))
        lengths.append(draw)
        total += int(draw.sum())
    lens = np.concatenate(lengths)
    cut = int(np.searchsorted(np.cumsum(lens), budget)) + 1
    lens = lens[:cut]
    lens[-1] -= int(lens.sum()) - budget  # exactly ``budget`` tokens per file
    if lens[-1] <= 0:
        lens = lens[:-1]
    offsets = np.zeros(len(lens) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    ranks = np.searchsorted(cdf, rng.random(int(offsets[-1])), side="right")
    values = ids[np.minimum(ranks, len(ids) - 1)]
    arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, type=pa.uint16()))
    return pa.table({"tokens": arr}), len(lens)


def ensure_corpus(data_dir: Path, spec: CorpusSpec, log: bool = True) -> Corpus:
    """Generate the corpus under ``data_dir`` unless an identical one is already there."""
    root = data_dir / spec.key
    meta_path = root / "corpus.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        return Corpus(
            root=root,
            files=meta["files"],
            stream=meta["stream"],
            documents=meta["documents"],
            tokens=meta["tokens"],
            stream_tokens=meta["stream_tokens"],
            spec=spec,
        )
    root.mkdir(parents=True, exist_ok=True)
    cdf = _zipf_cdf(spec.vocab_size - 1, spec.zipf_s)  # EOS is never drawn
    # A fixed shuffle of ranks to ids, so frequent ids are spread over the vocabulary as in real tokenizers.
    ids = np.random.default_rng(spec.seed).permutation(spec.vocab_size - 1).astype(np.uint16)
    nfiles = max(1, -(-spec.tokens // spec.tokens_per_file))
    per_file = [spec.tokens // nfiles + (1 if i < spec.tokens % nfiles else 0) for i in range(nfiles)]
    files: list[str] = []
    documents = 0
    stream_path = root / "stream.u16"
    with open(stream_path.with_suffix(".tmp"), "wb") as stream:
        for i, budget in enumerate(per_file):
            table, ndocs = _gen_file(spec, i, budget, cdf, ids)
            path = root / f"part-{i:04d}.parquet"
            pq.write_table(table, path, row_group_size=8192)
            files.append(str(path))
            documents += ndocs
            col = table.column("tokens").combine_chunks()
            values = col.values.to_numpy()
            offs = col.offsets.to_numpy()
            np.insert(values, offs[1:], np.uint16(spec.eos_id)).tofile(stream)
            if log:
                print(f"  corpus: wrote {path.name} ({budget / 1e6:.1f}M tokens, {ndocs} documents)", flush=True)
    os.replace(stream_path.with_suffix(".tmp"), stream_path)
    corpus = Corpus(root, files, str(stream_path), documents, spec.tokens, spec.tokens + documents, spec)
    meta_path.write_text(json.dumps({k: v for k, v in corpus.to_dict().items() if k not in ("root", "spec")}))
    return corpus
