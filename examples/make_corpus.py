"""Write a small synthetic pre-tokenized corpus for the README's quickstart: Parquet files with a
``tokens`` column (list<uint16>), the input ``ferry pack`` reads with ``--vocab-size``/``--eos-id``.

Needs only numpy and pyarrow (ferry's own requirements). Usage::

    python examples/make_corpus.py corpus --documents 2000 --files 2

Documents have log-normal lengths and Zipf-distributed token ids below ``--vocab-size`` (never the
EOS id, which ``ferry pack`` appends); the same arguments always write the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def documents(count: int, vocab_size: int, seed: int) -> list[np.ndarray]:
    """``count`` documents of token ids in ``[0, vocab_size - 1)`` (the last id is left for EOS)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(mean=5.5, sigma=0.8, size=count), 8, 8192).astype(np.int64)
    ids = (rng.zipf(1.2, size=int(lengths.sum())) - 1) % (vocab_size - 1)
    return np.split(ids.astype(np.uint16), np.cumsum(lengths)[:-1])


def write(out: Path, docs: list[np.ndarray], files: int) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, part in enumerate(np.array_split(np.arange(len(docs)), files)):
        column = pa.array([docs[j] for j in part], type=pa.list_(pa.uint16()))
        path = out / f"part-{i:05d}.parquet"
        pq.write_table(pa.table({"tokens": column}), path)
        paths.append(path)
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="directory to write part-NNNNN.parquet files into")
    parser.add_argument("--documents", type=int, default=2000)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=50257, help="at most 65536 (uint16 ids)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 2 <= args.vocab_size <= 65536 or args.documents < 1 or not 1 <= args.files <= args.documents:
        parser.error("need 2 <= --vocab-size <= 65536 and 1 <= --files <= --documents")
    docs = documents(args.documents, args.vocab_size, args.seed)
    paths = write(args.out, docs, args.files)
    tokens = sum(len(d) for d in docs)
    print(f"wrote {len(docs):,} documents, {tokens:,} tokens in {len(paths)} files under {args.out}")


if __name__ == "__main__":
    main()
