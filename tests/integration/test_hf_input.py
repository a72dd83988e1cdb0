"""Hugging Face datasets as input: save_to_disk directories and the Hub's Parquet layout, built
with the real `datasets` library (offline), read back equal, identical for any --workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

# before `datasets` is imported: it reads these once, and no test may reach the Hub
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
datasets = pytest.importorskip("datasets", reason="the test extra installs `datasets`: pip install 'ferry-data[test]'")
datasets.disable_progress_bars()

from ferry.shard_tools import InputFormatError, PackOptions, UsageError, open_dataset, pack  # noqa: E402
from ferry.shard_tools.cli import main  # noqa: E402

VOCAB = 1000
EOS = VOCAB - 1
SMALL = 4096  # bytes per shard: several shards per input
FERRY = [sys.executable, "-m", "ferry.shard_tools.cli"]
INT32_LISTS = datasets.Features({"input_ids": datasets.List(datasets.Value("int32")), "n": datasets.Value("int64")})


def make_docs(n: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, EOS, size=int(rng.integers(0, 200))).tolist() for _ in range(n)]
    docs[1] = []  # an empty document survives too
    return docs


def token_dataset(docs: list[list[int]]) -> Any:
    return datasets.Dataset.from_dict({"input_ids": docs, "n": list(range(len(docs)))}, features=INT32_LISTS)


def token_opts(**kw: Any) -> PackOptions:
    return PackOptions(vocab_size=VOCAB, eos_id=EOS, shard_size=SMALL, tokens_column="input_ids", **kw)


def read_back(url: str) -> list[list[int]]:
    return [d.tolist() for d in open_dataset(url).documents()]


def texts(n: int) -> list[str]:
    words = ["fox", "dog", "über", "数据", "", "jumps", "lazy", "\n"]
    return [" ".join(words[(i * 7 + j) % len(words)] for j in range(i % 13)) for i in range(n)]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def hub_repo(root: Path, splits: dict[str, Any], shards: int = 3) -> Path:
    """A dataset repository as the Hub lays it out: data/<split>-0000i-of-0000N.parquet."""
    (root / "data").mkdir(parents=True)
    for name, ds in splits.items():
        for i in range(shards):
            part = ds.shard(num_shards=shards, index=i, contiguous=True)
            part.to_parquet(str(root / "data" / f"{name}-{i:05d}-of-{shards:05d}.parquet"))
    return root


def test_saved_dataset_token_ids_round_trip(tmp_path: Path) -> None:
    docs = make_docs(600, 1)
    token_dataset(docs).save_to_disk(str(tmp_path / "saved"), num_shards=4)
    assert len(list((tmp_path / "saved").glob("*.arrow"))) == 4
    res = pack([str(tmp_path / "saved")], str(tmp_path / "out"), token_opts())
    assert res.documents == 600 and res.shards > 4
    assert read_back(str(tmp_path / "out")) == docs


def test_saved_dataset_of_a_transformed_dataset(tmp_path: Path) -> None:
    # shuffle / filter / select keep an indices mapping in memory; what is saved is what it reads as
    docs = make_docs(400, 2)
    ds = token_dataset(docs).shuffle(seed=3).filter(lambda r: r["n"] % 3 != 0).select(range(50, 200))
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=2)
    pack([str(tmp_path / "saved")], str(tmp_path / "out"), token_opts())
    expected = datasets.load_from_disk(str(tmp_path / "saved"))["input_ids"]
    assert read_back(str(tmp_path / "out")) == [list(d) for d in expected]
    assert read_back(str(tmp_path / "out")) == [list(d) for d in ds["input_ids"]]


def test_saved_text_with_a_tokenizer(tmp_path: Path) -> None:
    ds = datasets.Dataset.from_dict({"content": texts(300), "id": list(range(300))})
    ds.save_to_disk(str(tmp_path / "saved"), num_shards=3)
    out = str(tmp_path / "out")
    pack([str(tmp_path / "saved")], out, PackOptions(tokenizer="bytes", text_column="content", shard_size=SMALL))
    assert read_back(out) == [list(t.encode("utf-8")) for t in texts(300)]


def test_large_string_and_fixed_length_columns(tmp_path: Path) -> None:
    features = datasets.Features(
        {"text": datasets.Value("large_string"), "ids": datasets.List(datasets.Value("uint16"), length=3)}
    )
    rows = {"text": ["ab", "", "ü"], "ids": [[1, 2, 3], [4, 5, 6], [7, 8, 9]]}
    datasets.Dataset.from_dict(rows, features=features).save_to_disk(str(tmp_path / "saved"))
    pack([str(tmp_path / "saved")], str(tmp_path / "t"), PackOptions(tokenizer="bytes"))
    assert read_back(str(tmp_path / "t")) == [list(b"ab"), [], list("ü".encode())]
    pack([str(tmp_path / "saved")], str(tmp_path / "i"), PackOptions(vocab_size=10, tokens_column="ids", eos_id=0))
    assert read_back(str(tmp_path / "i")) == rows["ids"]


def test_dataset_dict_needs_a_split_when_it_has_several(tmp_path: Path) -> None:
    train, test = make_docs(300, 4), make_docs(40, 5)
    dd = datasets.DatasetDict({"train": token_dataset(train), "test": token_dataset(test)})
    dd.save_to_disk(str(tmp_path / "dd"), num_shards={"train": 3, "test": 1})
    for split, docs in (("train", train), ("test", test)):
        out = str(tmp_path / split)
        pack([str(tmp_path / "dd")], out, token_opts(split=split))
        assert read_back(out) == docs
    with pytest.raises(UsageError, match="has splits train, test: pass --split"):
        pack([str(tmp_path / "dd")], str(tmp_path / "x"), token_opts())
    with pytest.raises(UsageError, match="no split 'validation'"):
        pack([str(tmp_path / "dd")], str(tmp_path / "x"), token_opts(split="validation"))
    datasets.DatasetDict({"only": token_dataset(test)}).save_to_disk(str(tmp_path / "one"))
    pack([str(tmp_path / "one")], str(tmp_path / "one-out"), token_opts())  # one split: no --split needed
    assert read_back(str(tmp_path / "one-out")) == test


def test_hub_parquet_layout_reads_as_datasets_does(tmp_path: Path) -> None:
    train = datasets.Dataset.from_dict({"text": texts(500)})
    test = datasets.Dataset.from_dict({"text": texts(30)[::-1]})
    repo = hub_repo(tmp_path / "repo", {"train": train, "test": test})
    (repo / "README.md").write_text("---\nlicense: mit\n---\n# a dataset card\n")
    for split in ("train", "test"):
        out = str(tmp_path / f"out-{split}")
        pack([str(repo)], out, PackOptions(tokenizer="bytes", split=split, shard_size=SMALL, append_eos=False))
        loaded = datasets.load_dataset(str(repo), split=split, cache_dir=str(tmp_path / "cache"))
        assert read_back(out) == [list(t.encode("utf-8")) for t in loaded["text"]]
    with pytest.raises(UsageError, match="has splits test, train: pass --split"):
        pack([str(repo)], str(tmp_path / "x"), PackOptions(tokenizer="bytes"))


def test_hub_parquet_token_ids_of_a_config_directory(tmp_path: Path) -> None:
    # a multi-config repository keeps each config's files as <config>/<split>-*.parquet
    docs = make_docs(300, 6)
    config = tmp_path / "repo" / "en"
    config.mkdir(parents=True)
    for i in range(2):
        part = token_dataset(docs).shard(num_shards=2, index=i, contiguous=True)
        part.to_parquet(str(config / f"train-{i:05d}-of-00002.parquet"))
    pack([str(config)], str(tmp_path / "out"), token_opts())
    assert read_back(str(tmp_path / "out")) == docs


@pytest.mark.parametrize("layout", ["saved", "hub"])
def test_workers_1_and_2_byte_identical(tmp_path: Path, layout: str) -> None:
    ds = datasets.Dataset.from_dict({"text": texts(2000)})
    if layout == "saved":
        datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "in"), num_shards={"train": 4})
    else:
        hub_repo(tmp_path / "in", {"train": ds}, shards=4)
    before = tree(tmp_path / "in")
    versions = []
    for workers in ("1", "2"):
        out = tmp_path / f"w{workers}"
        args = ["pack", str(tmp_path / "in"), "--split", "train", "--out", str(out), "--tokenizer", "bytes"]
        proc = subprocess.run(
            [*FERRY, *args, "--shard-size", "8KiB", "--name", "hf", "--workers", workers, "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        versions.append(json.loads(proc.stdout)["version_id"])
    assert versions[0] == versions[1]
    assert tree(tmp_path / "w1" / "shards") == tree(tmp_path / "w2" / "shards")
    assert len(tree(tmp_path / "w1" / "shards")) > 4
    assert tree(tmp_path / "in") == before  # inputs only read


def test_packing_needs_no_datasets_package(tmp_path: Path) -> None:
    docs = make_docs(50, 7)
    token_dataset(docs).save_to_disk(str(tmp_path / "saved"))
    code = (
        "import sys; sys.modules['datasets'] = None\n"  # any `import datasets` now fails
        "from ferry.shard_tools.cli import main\n"
        f"sys.exit(main(['pack', {str(tmp_path / 'saved')!r}, '--out', {str(tmp_path / 'out')!r}, "
        "'--tokens-column', 'input_ids', '--vocab-size', '1000', '--eos-id', '999']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert read_back(str(tmp_path / "out")) == docs


def test_arrow_files_given_directly(tmp_path: Path) -> None:
    docs = make_docs(80, 8)
    table = pa.table({"tokens": pa.array(docs, type=pa.list_(pa.int64()))})
    with pa.OSFile(str(tmp_path / "a.arrow"), "wb") as f, pa.ipc.new_file(f, table.schema) as w:  # file format
        w.write_table(table, max_chunksize=30)
    with pa.OSFile(str(tmp_path / "b.arrow"), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:  # stream format
        w.write_table(table.slice(10), max_chunksize=7)
    out = str(tmp_path / "out")
    pack([str(tmp_path / "a.arrow"), str(tmp_path / "b.arrow")], out, PackOptions(vocab_size=VOCAB, eos_id=EOS))
    assert read_back(out) == docs + docs[10:]


# --- errors name the file and say what to do ---


def test_missing_column_names_the_arrow_file(tmp_path: Path) -> None:
    token_dataset(make_docs(20, 9)).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(InputFormatError, match=r"data-00000-of-00001\.arrow: no column 'tokens' .*input_ids"):
        pack([str(tmp_path / "saved")], str(tmp_path / "out"), PackOptions(vocab_size=VOCAB, eos_id=EOS))
    with pytest.raises(InputFormatError, match=r"data-00000-of-00001\.arrow: text column 'n' is int64"):
        pack([str(tmp_path / "saved")], str(tmp_path / "out"), PackOptions(tokenizer="bytes", text_column="n"))


def test_null_documents_name_the_file(tmp_path: Path) -> None:
    datasets.Dataset.from_dict({"text": ["a", None, "c"]}).save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(InputFormatError, match=r"\.arrow: column 'text' has null values"):
        pack([str(tmp_path / "saved")], str(tmp_path / "out"), PackOptions(tokenizer="bytes"))


def test_truncated_arrow_file(tmp_path: Path) -> None:
    token_dataset(make_docs(300, 10)).save_to_disk(str(tmp_path / "saved"))
    arrow = tmp_path / "saved" / "data-00000-of-00001.arrow"
    arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    with pytest.raises(InputFormatError, match=r"data-00000-of-00001\.arrow: not a readable Arrow IPC file"):
        pack([str(tmp_path / "saved")], str(tmp_path / "out"), token_opts())


def test_out_of_bounds_offsets_are_refused_not_read(tmp_path: Path) -> None:
    # IPC reading trusts the offsets it is given; a corrupt one must not read past the buffer
    table = pa.table({"tokens": pa.array([[1, 2], [3]], pa.list_(pa.int64()))})
    path = tmp_path / "bad.arrow"
    with pa.OSFile(str(path), "wb") as f, pa.ipc.new_stream(f, table.schema) as w:
        w.write_table(table)
    good, bad = np.array([0, 2, 3], np.int32).tobytes(), np.array([0, 2, 10**8], np.int32).tobytes()
    data = path.read_bytes()
    assert data.count(good) == 1
    path.write_bytes(data.replace(good, bad))
    with pytest.raises(InputFormatError, match=r"bad\.arrow: not a readable Arrow IPC file .*out of bounds"):
        pack([str(path)], str(tmp_path / "out"), PackOptions(vocab_size=10, append_eos=False))


@pytest.mark.parametrize(
    "state, needle",
    [
        ({"_data_files": [{"filename": "data-00001-of-00002.arrow"}]}, "data-00001-of-00002.arrow, which is missing"),
        ({"_data_files": [{"filename": "../outside.arrow"}]}, "bad entry"),
        ({"_data_files": {}}, '"_data_files" list'),
        ({"_data_files": [{"filename": "data-00000-of-00001.arrow"}], "_indices_data_files": [{"filename": "i"}]},
         "flatten_indices"),
        ("not json {", "not a readable JSON file"),
    ],
)  # fmt: skip
def test_bad_state_json_names_it(tmp_path: Path, state: Any, needle: str) -> None:
    token_dataset(make_docs(20, 11)).save_to_disk(str(tmp_path / "saved"))
    (tmp_path / "outside.arrow").write_bytes(b"")
    text = state if isinstance(state, str) else json.dumps(state)
    (tmp_path / "saved" / "state.json").write_text(text)
    with pytest.raises(InputFormatError, match="state.json") as info:
        pack([str(tmp_path / "saved")], str(tmp_path / "out"), token_opts())
    assert needle in str(info.value)


def test_bad_dataset_dict_json(tmp_path: Path) -> None:
    datasets.DatasetDict({"train": token_dataset(make_docs(20, 12))}).save_to_disk(str(tmp_path / "dd"))
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["../train"]}))
    with pytest.raises(InputFormatError, match=r"dataset_dict\.json: expected"):
        pack([str(tmp_path / "dd")], str(tmp_path / "out"), token_opts(split="../train"))
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(InputFormatError, match=r"split 'test' has no state\.json"):
        pack([str(tmp_path / "dd")], str(tmp_path / "out"), token_opts(split="test"))


@pytest.mark.parametrize(
    "make, args, needle",
    [
        ("plain-dir", [], "not a Hugging Face dataset directory"),
        ("saved", ["--split", "train"], "one saved Dataset (no split name), not a DatasetDict: drop --split"),
        ("in.parquet", ["--split", "train"], "--split train selects a split of a Hugging Face dataset"),
        ("in.parquet", ["--input-format", "hf"], "not a directory"),
    ],
)
def test_usage_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str, args: list[str], needle: str
) -> None:
    docs, path = make_docs(20, 13), tmp_path / ("in" if make in ("plain-dir", "saved") else make)
    if make == "plain-dir":
        path.mkdir()
        (path / "a.jsonl").write_text("{}\n")
    elif make == "saved":
        token_dataset(docs).save_to_disk(str(path))
    else:
        token_dataset(docs).to_parquet(str(path))
    code = main(["pack", str(path), "--out", str(tmp_path / "out"), "--vocab-size", "1000", "--no-eos", *args])
    err = capsys.readouterr().err
    assert code == 2 and needle in err
    assert "--split" in args or str(path) in err  # names the input
    assert err.count("\n") == 1  # one line, no traceback


@pytest.mark.parametrize("layout", ["saved", "hub"])
def test_dataset_directory_on_every_backend(backend: Any, tmp_path: Path, layout: str) -> None:
    import fsspec

    docs = make_docs(300, 14)
    ds = token_dataset(docs)
    local = tmp_path / "local"
    if layout == "saved":
        datasets.DatasetDict({"train": ds, "test": ds.select(range(5))}).save_to_disk(
            str(local), num_shards={"train": 3}
        )
    else:
        hub_repo(local, {"train": ds, "test": ds.select(range(5))})
    url = backend.url("input")
    fs, root = fsspec.core.url_to_fs(url, **backend.storage_options)
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        target = f"{root}/{path.relative_to(local)}"
        fs.makedirs(target.rsplit("/", 1)[0], exist_ok=True)
        fs.pipe_file(target, path.read_bytes())
    out = str(tmp_path / "out")
    pack([url + "/"], out, token_opts(split="train", input_storage_options=backend.storage_options))
    assert read_back(out) == docs


def test_a_dataset_of_no_rows(tmp_path: Path) -> None:
    empty = datasets.Dataset.from_dict({"input_ids": [], "n": []}, features=INT32_LISTS)
    empty.save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(UsageError, match="has no rows"):
        pack([str(tmp_path / "empty")], str(tmp_path / "out"), token_opts())
    docs = make_docs(30, 15)
    token_dataset(docs).save_to_disk(str(tmp_path / "full"))
    pack([str(tmp_path / "empty"), str(tmp_path / "full")], str(tmp_path / "out"), token_opts())  # adds nothing
    assert read_back(str(tmp_path / "out")) == docs
