"""Inputs of the split suite: one large JSON Lines file of text (with a BPE tokenizer trained on
it) and one large Parquet file of token ids, generated deterministically and kept in bench/data.

The text is synthetic but word-like: words built from syllables, Zipf-distributed, some with
punctuation, documents of log-normal length, so a byte-level BPE tokenizer does about the work
it does on prose. The same spec always gives the same files; a rerun reuses them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from corpus import CorpusSpec, _gen_file, _zipf_cdf

__all__ = ["SplitSpec", "SplitInputs", "ensure_split_inputs"]

_SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
_TOKENS_PER_GROUP = 8_000_000  # Parquet tokens generated (and written) at a time


@dataclass(frozen=True)
class SplitSpec:
    jsonl_bytes: int = 2**30 + 2**24  # just over 1 GiB: 8 sub-units at a 16 MiB shard size
    parquet_tokens: int = 440_000_000  # ~880 MB raw: 6 sub-units of 128 MiB, 3 per worker
    vocab_words: int = 30_000
    tokenizer_vocab: int = 16_384
    median_doc_words: int = 400
    seed: int = 20261201

    @property
    def jsonl_key(self) -> str:
        return f"split-jsonl-{self.jsonl_bytes}-{self.vocab_words}-{self.tokenizer_vocab}-{self.seed}"

    @property
    def parquet_key(self) -> str:
        return f"split-parquet-{self.parquet_tokens}-{self.seed}"


@dataclass(frozen=True)
class SplitInputs:
    jsonl: str
    tokenizer: str
    parquet: str
    jsonl_documents: int
    parquet_documents: int


def _words(spec: SplitSpec, rng: np.random.Generator) -> np.ndarray:
    lengths = rng.integers(1, 5, spec.vocab_words)
    pick = rng.integers(0, len(_SYLLABLES), int(lengths.sum()))
    words, pos = [], 0
    for n in lengths.tolist():
        words.append("".join(_SYLLABLES[i] for i in pick[pos : pos + n].tolist()))
        pos += n
    for i in range(0, spec.vocab_words, 10):  # some words carry punctuation, as in prose
        words[i] += ".,;:?!"[i // 10 % 6]
    return np.array(words, dtype=object)


def _write_jsonl(spec: SplitSpec, path: Path) -> int:
    rng = np.random.default_rng(spec.seed)
    words = _words(spec, rng)
    cdf = _zipf_cdf(spec.vocab_words, 1.05)
    written = docs = 0
    with open(path.with_suffix(".tmp"), "wb") as f:
        while written < spec.jsonl_bytes:
            lengths = np.maximum(1, rng.lognormal(np.log(spec.median_doc_words), 0.9, 2048).astype(np.int64))
            ids = np.minimum(np.searchsorted(cdf, rng.random(int(lengths.sum()))), spec.vocab_words - 1)
            chosen = words[ids]
            pos, lines = 0, []
            for n in lengths.tolist():
                lines.append(json.dumps({"id": docs, "text": " ".join(chosen[pos : pos + n])}) + "\n")
                pos += n
                docs += 1
            block = "".join(lines).encode()
            f.write(block)
            written += len(block)
    os.replace(path.with_suffix(".tmp"), path)
    return docs


def _train_tokenizer(spec: SplitSpec, jsonl: Path, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def sample() -> list[str]:
        out = []
        with open(jsonl, "rb") as f:
            for line in f.read(16 * 2**20).splitlines()[:-1]:
                out.append(json.loads(line)["text"])
        return out

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.tokenizer_vocab,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample(), trainer)
    tok.save(str(path))


def _write_parquet(spec: SplitSpec, path: Path) -> int:
    corpus_spec = CorpusSpec(tokens=spec.parquet_tokens, seed=spec.seed)
    cdf = _zipf_cdf(corpus_spec.vocab_size - 1, corpus_spec.zipf_s)
    ids = np.random.default_rng(spec.seed).permutation(corpus_spec.vocab_size - 1).astype(np.uint16)
    docs = 0
    schema = pa.schema([("tokens", pa.list_(pa.uint16()))])
    with pq.ParquetWriter(path.with_suffix(".tmp"), schema) as writer:
        for i, start in enumerate(range(0, spec.parquet_tokens, _TOKENS_PER_GROUP)):
            budget = min(_TOKENS_PER_GROUP, spec.parquet_tokens - start)
            table, n = _gen_file(corpus_spec, i, budget, cdf, ids)
            writer.write_table(table, row_group_size=8192)
            docs += n
    os.replace(path.with_suffix(".tmp"), path)
    return docs


def ensure_split_inputs(data_dir: Path, spec: SplitSpec, log: bool = True) -> SplitInputs:
    """Generate the suite's inputs under ``data_dir`` unless identical ones are there already."""
    text_root, token_root = data_dir / spec.jsonl_key, data_dir / spec.parquet_key
    jsonl, tokenizer, parquet = text_root / "corpus.jsonl", text_root / "tokenizer.json", token_root / "tokens.parquet"
    text_meta, token_meta = text_root / "inputs.json", token_root / "inputs.json"
    if not text_meta.exists():
        text_root.mkdir(parents=True, exist_ok=True)
        docs = _write_jsonl(spec, jsonl)
        _train_tokenizer(spec, jsonl, tokenizer)
        text_meta.write_text(json.dumps({"documents": docs}))
        if log:
            print(f"  split: wrote {jsonl.name} ({jsonl.stat().st_size / 1e9:.2f} GB, {docs} documents)", flush=True)
    if not token_meta.exists():
        token_root.mkdir(parents=True, exist_ok=True)
        token_meta.write_text(json.dumps({"documents": _write_parquet(spec, parquet)}))
        if log:
            print(f"  split: wrote {parquet.name} ({parquet.stat().st_size / 1e9:.2f} GB)", flush=True)
    return SplitInputs(
        str(jsonl),
        str(tokenizer),
        str(parquet),
        json.loads(text_meta.read_text())["documents"],
        json.loads(token_meta.read_text())["documents"],
    )
