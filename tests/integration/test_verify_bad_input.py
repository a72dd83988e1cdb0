"""Bad input gets a specific FerryError, ``ferry verify`` exits non-zero naming the shard, nothing is lost."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import Backend, arrow_file, run_verify

from ferry.shard_tools import (
    InputFormatError,
    ManifestError,
    MegatronIndexError,
    PackOptions,
    ShardDigestError,
    ShardFormatError,
    ShardMissingError,
    TokenRangeError,
    UsageError,
    open_dataset,
    pack,
    pack_documents,
    verify,
)
from ferry.shard_tools.cli import main
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.manifest import Manifest, ShardInfo, ShardTable, Tokenizer
from ferry.shard_tools.format.megatron import write_megatron
from ferry.shard_tools.format.shard import compress
from ferry.shard_tools.storage.publish import publish_version
from ferry.shard_tools.storage.store import Location, resolve

OPTS = PackOptions(vocab_size=500, eos_id=499, shard_size=2048, name="bad")


def make(tmp_path: Path, n: int = 60) -> tuple[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 499, size=int(rng.integers(1, 100))) for _ in range(n)]
    out = str(tmp_path / "ds")
    pack_documents(docs, out, OPTS)
    return out, docs


def shard_file(out: str, i: int = 1) -> tuple[str, Path]:
    rel = open_dataset(out).manifest.shards[i].path
    return rel, Path(out) / rel


def make_on(backend: Backend, n: int = 60) -> tuple[str, Location]:
    """A small dataset at a fresh URL on ``backend``, and its Location (to damage it through)."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 499, size=int(rng.integers(1, 100))) for _ in range(n)]
    out = backend.url("ds")
    pack_documents(docs, out, replace(OPTS, storage_options=backend.storage_options))
    return out, resolve(out, backend.storage_options)


def shard_rel(out: str, backend: Backend, i: int = 1) -> str:
    return open_dataset(out, storage_options=backend.storage_options).manifest.shards[i].path


def test_good_dataset_verifies(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = make_on(backend)
    code, _, report = run_verify(out, capsys, backend.storage_options)
    assert code == 0 and report["ok"] and report["checked"] == report["shards"] > 2


def test_flipped_byte(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    out, loc = make_on(backend)
    rel = shard_rel(out, backend)
    data = bytearray(loc.read_bytes(rel))
    data[len(data) // 2] ^= 0x40
    loc.write_bytes(rel, bytes(data))
    with pytest.raises(ShardDigestError) as exc:
        open_dataset(out, storage_options=backend.storage_options).read_shard(1)
    assert exc.value.shard == rel
    code, err, report = run_verify(out, capsys, backend.storage_options)
    assert code == 1 and rel in err and list(report["bad"]) == [rel]


def test_truncated_shard(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    out, loc = make_on(backend)
    rel = shard_rel(out, backend)
    loc.write_bytes(rel, loc.read_bytes(rel)[:-10])
    with pytest.raises(ShardFormatError, match="truncated"):
        open_dataset(out, storage_options=backend.storage_options).read_shard(1)
    code, err, report = run_verify(out, capsys, backend.storage_options)
    assert code == 1 and f"BAD {rel}" in err and rel in report["bad"]


def test_missing_shard(backend: Backend, capsys: pytest.CaptureFixture[str]) -> None:
    out, loc = make_on(backend)
    rel = shard_rel(out, backend, 0)
    loc.remove(rel)
    with pytest.raises(ShardMissingError):
        open_dataset(out, storage_options=backend.storage_options).read_shard(0)
    code, err, report = run_verify(out, capsys, backend.storage_options)
    assert code == 1 and rel in err and "missing" in report["bad"][rel]


def test_malformed_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = make(tmp_path)
    mpath = Path(out) / "manifest.json"
    mpath.write_text(mpath.read_text()[:-20])
    with pytest.raises(ManifestError, match="not valid JSON"):
        open_dataset(out)
    code, err, report = run_verify(out, capsys)
    assert code == 1 and "not valid JSON" in err and not report["ok"]


def test_hand_edited_manifest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, _ = make(tmp_path)
    mpath = Path(out) / "manifest.json"
    doc = json.loads(mpath.read_text())
    doc["totals"]["tokens"] += 1
    mpath.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="does not match its version id"):
        open_dataset(out)
    code, err, _ = run_verify(out, capsys)
    assert code == 1 and "hand-edited" in err


def test_swapped_shard_table(tmp_path: Path) -> None:
    out, _ = make(tmp_path)
    doc = json.loads((Path(out) / "manifest.json").read_text())
    table = Path(out) / doc["shard_table"]["path"]
    table.write_bytes(table.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ManifestError, match="shard table"):
        open_dataset(out)


def test_unknown_dtype_in_manifest(tmp_path: Path) -> None:
    out, _ = make(tmp_path)
    mpath = Path(out) / "manifest.json"
    doc = json.loads(mpath.read_text())
    doc["token_dtype"] = "int8"
    body = {k: v for k, v in doc.items() if k not in ("version_id", "created_at", "tool_version")}
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    doc["version_id"] = digest_bytes(canonical).split(":", 1)[1]  # a consistent id: the dtype check must catch it
    mpath.write_text(json.dumps(doc))
    with pytest.raises(ManifestError, match="unknown token dtype 'int8'"):
        open_dataset(out)


def publish_raw_shard(out: str, raw: bytes, documents: int, tokens: int, vocab: int = 500) -> str:
    """Publish a dataset whose one shard is ``raw`` (a hand-made Arrow file), with honest digests."""
    stored = compress(raw, 1)
    rel = f"shards/{digest_bytes(raw).split(':', 1)[1]}.arrow.zst"
    loc = resolve(out)
    loc.write_bytes(rel, stored)
    row = ShardInfo(rel, documents, tokens, len(stored), len(raw), digest_bytes(stored), digest_bytes(raw))
    m, table = Manifest.build(
        name="x",
        token_dtype="uint16",
        tokenizer=Tokenizer("none", vocab, None),
        eos_appended=False,
        shards=ShardTable.from_rows([row]),
        parent=None,
        created_at="now",
        tool_version="test",
    )
    publish_version(loc, m, table, expect_current=None, new_shards=[rel])
    return rel


def test_unknown_dtype_in_shard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "ds")
    rel = publish_raw_shard(out, arrow_file(pa.array([[1.5, 2.5]], type=pa.list_(pa.float32()))), 1, 2)
    with pytest.raises(ShardFormatError, match="unknown token dtype"):
        open_dataset(out).read_shard(0)
    code, err, _ = run_verify(out, capsys)
    assert code == 1 and rel in err


def test_token_beyond_vocab_in_shard(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "ds")
    rel = publish_raw_shard(out, arrow_file(pa.array([[1, 2, 600]], type=pa.list_(pa.uint16()))), 1, 3, vocab=500)
    report = verify(out)
    assert not report.ok and "600" in report.bad[rel]
    code, err, _ = run_verify(out, capsys)
    assert code == 1 and rel in err


def test_megatron_wrong_magic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_megatron(str(tmp_path / "m"), [np.arange(5)], np.dtype(np.uint16))
    idx = tmp_path / "m.idx"
    idx.write_bytes(b"NOTMAGIC!" + idx.read_bytes()[9:])
    with pytest.raises(MegatronIndexError, match="wrong magic"):
        pack([str(tmp_path / "m.bin")], str(tmp_path / "ds"), OPTS)
    args = ["pack", str(tmp_path / "m.idx"), "--out", str(tmp_path / "ds"), "--vocab-size", "500", "--no-eos"]
    assert main(args) == 1
    assert "m.idx" in capsys.readouterr().err
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_token_id_beyond_vocab_at_pack_time(tmp_path: Path) -> None:
    docs = [[1, 2, 3], [4, 500, 6]]
    with pytest.raises(TokenRangeError, match=r"token id 500 in document 1 .*\[0, 500\)"):
        pack_documents(docs, str(tmp_path / "ds"), OPTS)
    with pytest.raises(TokenRangeError, match="token id -1"):
        pack_documents([[1, -1]], str(tmp_path / "ds"), OPTS)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_bad_inputs_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(InputFormatError, match="bad.parquet"):
        pack([str(tmp_path / "bad.parquet")], str(tmp_path / "ds"), OPTS)
    (tmp_path / "bad.jsonl").write_text('{"tokens": [1, 2]}\n{"tokens": "oops"}\n')
    with pytest.raises(InputFormatError, match=r"bad.jsonl:2"):
        pack([str(tmp_path / "bad.jsonl")], str(tmp_path / "ds"), OPTS)
    with pytest.raises(UsageError, match="does not exist"):
        pack([str(tmp_path / "nope.parquet")], str(tmp_path / "ds"), OPTS)
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "t.parquet")
    with pytest.raises(InputFormatError, match="no column 'tokens'"):
        pack([str(tmp_path / "t.parquet")], str(tmp_path / "ds"), OPTS)


def snapshot(root: Path) -> dict[str, str]:
    """Digest of every manifest and version file (what a failed append must not touch)."""
    files = [root / "manifest.json", *sorted((root / "versions").iterdir())]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def test_failed_append_changes_nothing(tmp_path: Path) -> None:
    out, docs = make(tmp_path)
    before = snapshot(Path(out))
    old_id = open_dataset(out).version_id
    # an input error halfway: the first file packs, the second is corrupt
    good, bad = tmp_path / "good.parquet", tmp_path / "zbad.parquet"
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 3]] * 50)}), good)
    bad.write_bytes(b"garbage")
    append = PackOptions(vocab_size=500, eos_id=499, shard_size=2048, append=True)
    with pytest.raises(InputFormatError):
        pack([str(good), str(bad)], out, append)
    assert snapshot(Path(out)) == before
    # a token out of range in the second file
    pq.write_table(pa.table({"tokens": pa.array([[1, 2, 999]])}), bad)
    with pytest.raises(TokenRangeError):
        pack([str(good), str(bad)], out, append)
    assert snapshot(Path(out)) == before
    # a mismatched vocabulary, dtype or EOS
    for opts in (
        PackOptions(vocab_size=501, eos_id=499, append=True),
        PackOptions(vocab_size=70_000, eos_id=499, append=True),
        PackOptions(vocab_size=500, append_eos=False, append=True),
    ):
        with pytest.raises(UsageError, match="cannot append"):
            pack([str(good)], out, opts)
    with pytest.raises(UsageError, match="cannot append"):
        pack([str(tmp_path / "good.parquet")], out, PackOptions(tokenizer="bytes", append=True))
    assert snapshot(Path(out)) == before
    assert [d.tolist() for d in open_dataset(out).documents()] == [d.tolist() for d in docs]
    # and a good append adds a version on top
    res = pack([str(good)], out, append)
    assert res.parent == old_id and res.new_shards >= 1
    assert len(list(open_dataset(out).documents())) == len(docs) + 50


def test_pack_refuses_existing_dataset_without_append(tmp_path: Path) -> None:
    out, _ = make(tmp_path)
    with pytest.raises(UsageError, match="--append"):
        pack_documents([[1]], out, OPTS)


def test_verify_cli_subprocess_names_shard(tmp_path: Path) -> None:
    out, _ = make(tmp_path)
    rel, path = shard_file(out, 2)
    data = bytearray(path.read_bytes())
    data[20] ^= 1
    path.write_bytes(bytes(data))
    env = {**os.environ}
    proc = subprocess.run(
        [sys.executable, "-m", "ferry.shard_tools.cli", "verify", out],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 1
    assert f"BAD {rel}" in proc.stderr and "1 of" in proc.stderr


@pytest.mark.parametrize("count", [3, 100])  # one HEAD each, or one listing
def test_publish_refuses_missing_shards(tmp_path: Path, count: int) -> None:
    from ferry.shard_tools import PublishError

    loc = resolve(str(tmp_path / "ds"))
    rows = []
    for i in range(count):
        rel = f"shards/{i:032x}.arrow.zst"
        if i != count // 2:
            loc.write_bytes(rel, b"x")
        rows.append(ShardInfo(rel, 1, 1, 1, 1, digest_bytes(b"x"), digest_bytes(b"x")))
    m, table = Manifest.build(
        name="x", token_dtype="uint16", tokenizer=Tokenizer("none", 10, None), eos_appended=False,
        shards=ShardTable.from_rows(rows), parent=None, created_at="t", tool_version="t",
    )  # fmt: skip
    with pytest.raises(PublishError, match=f"shard shards/{count // 2:032x}.arrow.zst not stored"):
        publish_version(loc, m, table, expect_current=None, new_shards=[r.path for r in rows])
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_concurrent_writer_loses_cleanly(tmp_path: Path) -> None:
    from ferry.shard_tools import PublishError

    out, docs = make(tmp_path)
    loc = resolve(out)
    current = open_dataset(out).manifest
    stale = current.parent  # a writer that started before the current version was published
    m, table = Manifest.build(
        name="bad", token_dtype="uint16", tokenizer=current.tokenizer, eos_appended=True,
        shards=current.shards, parent=stale, created_at="t", tool_version="t",
    )  # fmt: skip
    before = (Path(out) / "manifest.json").read_bytes()
    with pytest.raises(PublishError, match="changed while packing"):
        publish_version(loc, m, table, expect_current=stale)
    assert (Path(out) / "manifest.json").read_bytes() == before
