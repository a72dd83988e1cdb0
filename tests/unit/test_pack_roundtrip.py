"""Round trip: for every input format, the documents read back equal the documents put in."""

from __future__ import annotations

import gzip
import json
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferry.shard_tools import PackOptions, open_dataset, pack, pack_documents
from ferry.shard_tools.export import export_megatron
from ferry.shard_tools.format.megatron import read_index, write_megatron

VOCAB = 1000
EOS = VOCAB - 1
SMALL = 4096  # bytes per shard: several shards per input


def make_docs(n: int, seed: int = 0, vocab: int = EOS, max_len: int = 300) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, vocab, size=int(rng.integers(0, max_len))) for _ in range(n)]
    docs[1] = np.zeros(0, dtype=np.int64)  # an empty document survives too
    return docs


def read_back(url: str, **kw: object) -> list[list[int]]:
    return [d.tolist() for d in open_dataset(url, **kw).documents()]  # type: ignore[arg-type]


def as_lists(docs: list[np.ndarray]) -> list[list[int]]:
    return [np.asarray(d).tolist() for d in docs]


def token_opts(**kw: object) -> PackOptions:
    return PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=SMALL, **kw)  # type: ignore[arg-type]


def write_parquet_tokens(path: Path, docs: list[np.ndarray], column: str = "tokens") -> None:
    arr = pa.array([d.tolist() for d in docs], type=pa.list_(pa.int32()))
    pq.write_table(pa.table({column: arr, "other": pa.array(range(len(docs)))}), path, row_group_size=37)


def test_parquet_tokens_multi_file(tmp_path: Path) -> None:
    a, b = make_docs(200, 1), make_docs(150, 2)
    write_parquet_tokens(tmp_path / "a.parquet", a)
    write_parquet_tokens(tmp_path / "b.parquet", b)
    out = str(tmp_path / "ds")
    res = pack([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], out, token_opts())
    assert res.shards > 4 and res.documents == 350
    assert read_back(out) == as_lists(a + b)
    ds = open_dataset(out)
    # stored stream = each document followed by EOS, in order
    flat = np.concatenate(list(ds.tokens()))
    expect = np.concatenate([np.append(d, EOS) for d in a + b])
    assert np.array_equal(flat, expect) and ds.manifest.token_dtype == "uint16"


def test_parquet_custom_column_and_uint32(tmp_path: Path) -> None:
    docs = make_docs(50, 3, vocab=100_000)
    write_parquet_tokens(tmp_path / "x.parquet", docs, column="ids")
    out = str(tmp_path / "ds")
    pack([str(tmp_path / "x.parquet")], out, PackOptions(vocab_size=100_001, eos_id=100_000, tokens_column="ids"))
    assert open_dataset(out).manifest.token_dtype == "uint32"
    assert read_back(out) == as_lists(docs)


def test_parquet_text_bytes_tokenizer(tmp_path: Path) -> None:
    texts = ["hello world", "", "ünïcödé ✓ text", "x" * 5000]
    pq.write_table(pa.table({"text": texts}), tmp_path / "t.parquet")
    out = str(tmp_path / "ds")
    pack([str(tmp_path / "t.parquet")], out, PackOptions(tokenizer="bytes", shard_size=SMALL))
    assert read_back(out) == [list(t.encode()) for t in texts]
    m = open_dataset(out).manifest
    assert (m.tokenizer.name, m.tokenizer.vocab_size, m.tokenizer.eos_id) == ("bytes", 257, 256)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_tokens(tmp_path: Path, suffix: str) -> None:
    docs = make_docs(120, 4)
    body = "".join(json.dumps({"tokens": d.tolist(), "meta": i}) + "\n" for i, d in enumerate(docs)).encode()
    path = tmp_path / f"in{suffix}"
    if suffix.endswith(".gz"):
        body = gzip.compress(body)
    elif suffix.endswith(".zst"):
        body = zstandard.ZstdCompressor().compress(body)
    path.write_bytes(body)
    out = str(tmp_path / "ds")
    pack([str(path)], out, token_opts())
    assert read_back(out) == as_lists(docs)


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_jsonl_text(tmp_path: Path, suffix: str) -> None:
    texts = ["first document", "second — with unicode ∑", "", "line\nbreaks\ninside"]
    body = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
    if suffix.endswith(".gz"):
        body = gzip.compress(body)
    elif suffix.endswith(".zst"):
        body = zstandard.ZstdCompressor().compress(body)
    path = tmp_path / f"in{suffix}"
    path.write_bytes(body)
    out = str(tmp_path / "ds")
    pack([str(path)], out, PackOptions(tokenizer="bytes", shard_size=SMALL))
    assert read_back(out) == [list(t.encode()) for t in texts]


def test_text_per_file_and_per_line(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("one whole file\nwith two lines\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("another ✓ file", encoding="utf-8")
    out = str(tmp_path / "per_file")
    pack([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], out, PackOptions(tokenizer="bytes"))
    assert read_back(out) == [list(b"one whole file\nwith two lines\n"), list("another ✓ file".encode())]

    out = str(tmp_path / "per_line")
    (tmp_path / "crlf.txt").write_bytes(b"windows line\r\n\r\nlast\r\n")
    pack([str(tmp_path / "a.txt"), str(tmp_path / "crlf.txt")], out, PackOptions(tokenizer="bytes", text_per_line=True))
    assert read_back(out) == [list(b"one whole file"), list(b"with two lines"), list(b"windows line"), list(b"last")]


def tiny_hf_tokenizer(path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"])
    tok.train_from_iterator(["the quick brown fox", "jumps over the lazy dog", "a fox and a dog"], trainer)
    tok.save(str(path))
    return path


def test_hf_tokenizer_json(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    tj = tiny_hf_tokenizer(tmp_path / "tokenizer.json")
    texts = ["the quick brown fox", "a lazy dog jumps", "unknown words map to unk", ""]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (tmp_path / "in2.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in reversed(texts)))
    inputs = [str(tmp_path / "in.jsonl"), str(tmp_path / "in2.jsonl")]
    out = str(tmp_path / "ds")
    one = pack(inputs, out, PackOptions(tokenizer=str(tj), name="hf"))
    hf = Tokenizer.from_file(str(tj))
    assert read_back(out) == [hf.encode(t, add_special_tokens=False).ids for t in texts + texts[::-1]]
    # the tokenizer travels to worker processes; same version either way
    two = pack(inputs, str(tmp_path / "ds2"), PackOptions(tokenizer=str(tj), name="hf", workers=2))
    assert two.version_id == one.version_id
    m = open_dataset(out).manifest
    assert m.tokenizer.eos_id == hf.token_to_id("</s>") and m.tokenizer.vocab_size == hf.get_vocab_size()


def test_npy_stream_split_on_eos(tmp_path: Path) -> None:
    docs = make_docs(80, 5)
    stream = np.concatenate([np.append(d, EOS) for d in docs]).astype(np.uint16)
    np.save(tmp_path / "s.npy", stream)
    out = str(tmp_path / "ds")
    pack([str(tmp_path / "s.npy")], out, token_opts())
    assert read_back(out) == as_lists(docs)


def test_npy_stream_blocks_and_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ferry.shard_tools.sources.npy as npy_source

    monkeypatch.setattr(npy_source, "SCAN_BLOCK", 97)  # documents straddle scan blocks
    docs = make_docs(60, 6)
    stream = np.concatenate([np.append(d, EOS) for d in docs] + [np.array([5, 6, 7])]).astype(np.int32)
    np.save(tmp_path / "s.npy", stream)
    out = str(tmp_path / "ds")
    pack([str(tmp_path / "s.npy")], out, token_opts())
    assert read_back(out) == as_lists(docs) + [[5, 6, 7]]


def test_npy_object_array(tmp_path: Path) -> None:
    docs = make_docs(70, 7)
    arr = np.empty(len(docs), dtype=object)
    for i, d in enumerate(docs):
        arr[i] = d.astype(np.int32)
    np.save(tmp_path / "o.npy", arr, allow_pickle=True)
    out = str(tmp_path / "ds")
    pack([str(tmp_path / "o.npy")], out, token_opts())
    assert read_back(out) == as_lists(docs)


def test_megatron_in_and_export(tmp_path: Path) -> None:
    docs = make_docs(400, 8)
    write_megatron(str(tmp_path / "corpus"), docs, np.dtype(np.uint16))
    out = str(tmp_path / "ds")
    res = pack([str(tmp_path / "corpus.bin")], out, token_opts())
    assert res.shards > 3
    assert read_back(out) == as_lists(docs)

    # export keeps EOS by default (Megatron --append-eod), or strips it
    for keep in (True, False):
        prefix = str(tmp_path / f"export-{keep}")
        n = export_megatron(out, prefix, keep_eos=keep)
        assert n == len(docs)
        index = read_index(prefix)
        data = np.fromfile(prefix + ".bin", dtype=index.dtype)
        got = [data[p // 2 : p // 2 + n].tolist() for p, n in zip(index.pointers, index.lengths, strict=True)]
        assert got == [d.tolist() + ([EOS] if keep else []) for d in docs]


def test_megatron_prefix_given_twice_counts_once(tmp_path: Path) -> None:
    docs = make_docs(30, 9)
    write_megatron(str(tmp_path / "c"), docs, np.dtype(np.int32))
    out = str(tmp_path / "ds")
    pack([str(tmp_path / "c.bin"), str(tmp_path / "c.idx")], out, token_opts())
    assert read_back(out) == as_lists(docs)


def test_no_eos(tmp_path: Path) -> None:
    docs = make_docs(40, 10)
    out = str(tmp_path / "ds")
    pack_documents(docs, out, PackOptions(vocab_size=VOCAB, append_eos=False))
    ds = open_dataset(out)
    assert not ds.manifest.eos_appended and ds.manifest.tokenizer.eos_id is None
    assert read_back(out) == as_lists(docs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 65534), max_size=50), max_size=40))
def test_property_small_examples(docs: list[list[int]]) -> None:
    out = f"memory://ferry-prop-{uuid.uuid4().hex}"
    pack_documents(docs, out, PackOptions(vocab_size=65536, eos_id=65535, shard_size=1024))
    assert read_back(out) == docs


@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), mean=st.integers(1, 40))
def test_property_100k_documents(tmp_path_factory: pytest.TempPathFactory, seed: int, mean: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.geometric(1 / mean, size=100_000) - 1  # includes empty documents
    flat = rng.integers(0, 65535, size=int(lengths.sum()), dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    docs = [flat[offsets[i] : offsets[i + 1]] for i in range(len(lengths))]
    out = str(tmp_path_factory.mktemp("prop") / "ds")
    res = pack_documents(docs, out, PackOptions(vocab_size=65536, eos_id=65535, shard_size=256 * 1024))
    assert res.documents == 100_000
    got = list(open_dataset(out).documents())
    assert len(got) == 100_000
    assert np.array_equal(np.fromiter((len(d) for d in got), dtype=np.int64), lengths)
    assert np.array_equal(np.concatenate(got), flat)


def test_input_globs_are_expanded_in_order(tmp_path: Path) -> None:
    docs = make_docs(30, 12)
    for i in range(3):
        write_parquet_tokens(tmp_path / f"p{i}.parquet", docs[i * 10 : (i + 1) * 10])
    out = str(tmp_path / "ds")
    pack([f"file://{tmp_path}/p*.parquet"], out, token_opts())
    assert read_back(out) == as_lists(docs)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([1, 2.5, 3], "float64"),
        (np.array([1.0, 2.0]), "float64"),
        (["1", "2"], "<U1"),
        ([[1, 2], [3, 4]], "2-d"),
        ([1, 2**70], "object"),
        ([True, False], "bool"),
        (np.array([2**63 + 5], dtype=np.uint64), "out of range"),
    ],
)
def test_pack_documents_refuses_ids_that_are_not_integers(tmp_path: Path, doc: object, message: str) -> None:
    from ferry.shard_tools.errors import InputFormatError

    with pytest.raises(InputFormatError, match=f"document 1: .*{message}"):
        pack_documents([[5, 6], doc], str(tmp_path / "ds"), PackOptions(vocab_size=1000, eos_id=0))
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_pack_documents_takes_any_integer_dtype_and_empty_documents(tmp_path: Path) -> None:
    docs = [[1, 2], np.array([3, 4], dtype=np.uint16), np.array([5], dtype=np.int32), []]
    pack_documents(docs, str(tmp_path / "ds"), PackOptions(vocab_size=1000, eos_id=0))
    got = [d.tolist() for d in open_dataset(str(tmp_path / "ds")).documents()]
    assert got == [[1, 2], [3, 4], [5], []]
