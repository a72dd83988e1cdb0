"""StoredShards: a version's header and its table's path, stored size and stored digest columns alone."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from ferry.shard_tools import ManifestError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.header import version_id_of
from ferry.shard_tools.format.manifest import (
    Manifest,
    ShardInfo,
    ShardTable,
    StoredShards,
    Tokenizer,
    digest_column,
    digest_strings,
)
from ferry.shard_tools.format.policy import MediaPolicy

STORED = "xxh128:" + "1" * 32
RAW = "xxh128:" + "2" * 32
INDEX = "xxh128:" + "3" * 32


def build(rows: list[ShardInfo], media: bool = False) -> tuple[Manifest, bytes]:
    return Manifest.build(
        name="d",
        token_dtype="uint16",
        tokenizer=Tokenizer("bytes", 257, 256),
        eos_appended=True,
        shards=ShardTable.from_rows(rows, media=media),
        parent=None,
        created_at="2026-01-01T00:00:00+00:00",
        tool_version="0.1.0",
        media=MediaPolicy().with_ids(257) if media else None,
    )


def flat(i: int) -> ShardInfo:
    return ShardInfo(f"shards/{i:032x}.arrow.zst", 10, 1000, 500 + i, 2000, STORED[:-4] + f"{i:04x}", RAW)


def seekable(i: int) -> ShardInfo:
    return ShardInfo(f"shards/{i:032x}.s3.arrow.zst", 1, 9, 700 + i, 900, STORED, RAW, 40, INDEX, 1 << 20)


@pytest.mark.parametrize(
    "rows, media",
    [([], False), ([flat(i) for i in range(5)], False), ([flat(0), seekable(1), seekable(2)], False),
     ([flat(0), seekable(1)], True)],
    ids=["empty", "format-1", "formats-1-3", "media"],
)  # fmt: skip
def test_columns_are_the_full_loads(rows: list[ShardInfo], media: bool) -> None:
    m, table = build(rows, media)
    full = Manifest.from_json(m.to_json(), table)
    got = StoredShards.from_json(m.to_json(), table)
    assert (got.version_id, got.table_path, got.table_digest) == (m.version_id, m.table_path, m.table_digest)
    assert got.created_at == m.created_at and got.lineage == m.lineage and got.to_json() == m.to_json()
    assert got.paths.to_pylist() == full.shards.paths == [r.path for r in rows]
    assert got.stored_bytes.tolist() == full.shards.stored_bytes.tolist() == [r.stored_bytes for r in rows]
    assert digest_strings(got.stored_digests) == [r.stored_digest for r in rows]
    assert got.stored_digests.type == pa.binary(16)
    assert len(got) == len(rows)


def naming(header: bytes, table: bytes, totals: dict[str, Any] | None = None) -> bytes:
    """``header`` edited to name ``table`` with its right digest and size (and ``totals`` changed): what a
    writer that skips ferry's checks could publish."""
    doc = json.loads(header)
    doc["shard_table"].update(digest=digest_bytes(table), bytes=len(table))
    doc["totals"].update(totals or {})
    body = {k: v for k, v in doc.items() if k not in ("version_id", "created_at", "tool_version")}
    doc["version_id"] = version_id_of(body)
    return json.dumps(doc).encode()


def forged(
    rows: list[ShardInfo], edit: Callable[[pa.Table], pa.Table], totals: dict[str, Any] | None = None
) -> tuple[bytes, bytes]:
    """A header and the table of ``rows`` as ``edit`` changes it, the header naming it."""
    m, data = build(rows)
    table = edit(pa.ipc.open_file(pa.py_buffer(data)).read_all())
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    out = sink.getvalue().to_pybytes()
    return naming(m.to_json(), out, totals), out


def _set(name: str, values: list[Any]) -> Callable[[pa.Table], pa.Table]:
    def edit(t: pa.Table) -> pa.Table:
        i = t.schema.get_field_index(name)
        return t.set_column(i, t.schema.field(i), pa.array(values, type=t.schema.field(i).type))

    return edit


@pytest.mark.parametrize(
    "edit, totals, needle",
    [
        (_set("path", ["shards/a.arrow.zst", "../b"]), None, "not under shards/"),
        (_set("path", ["shards/a.arrow.zst", None]), None, "not under shards/"),
        (_set("stored_digest", [STORED, "md5:00"]), None, "digest"),
        (_set("stored_digest", [STORED, None]), None, "null digest"),
        (_set("stored_digest", [STORED, STORED.upper()]), None, "digest"),
        (_set("stored_digest", [STORED, "xxh129:" + "1" * 32]), None, "digest"),
        (_set("stored_digest", [STORED, STORED[:-1] + "g"]), None, "digest"),
        (_set("stored_digest", [STORED, STORED[:-2] + "\u00e9"]), None, "digest"),
        (_set("stored_digest", [STORED[:-1], STORED + "1"]), None, "digest"),
        (_set("stored_bytes", [5, -5]), {"stored_bytes": 0}, "negative"),
        (_set("stored_bytes", [5, 6]), None, "totals"),
        (lambda t: t.drop_columns(["raw_digest"]), None, "schema"),
        (lambda t: t.slice(0, 1), None, "totals"),
    ],
    ids=[
        "path",
        "null-path",
        "digest",
        "null-digest",
        "upper-hex",
        "other-algorithm",
        "not-hex",
        "two-byte-char",
        "lengths-sum-right",
        "negative",
        "sizes-vs-totals",
        "schema",
        "rows-vs-totals",
    ],
)
def test_loaded_columns_are_checked(edit: Callable[[pa.Table], pa.Table], totals: Any, needle: str) -> None:
    header, table = forged([flat(0), flat(1)], edit, totals)
    with pytest.raises(ManifestError, match=needle):
        StoredShards.from_json(header, table)


def test_table_bytes_must_match_the_header() -> None:
    m, table = build([flat(0), flat(1)])
    with pytest.raises(ManifestError, match="does not match its digest"):
        StoredShards.from_json(m.to_json(), table[:-1] + bytes([table[-1] ^ 1]))
    junk = b"not an Arrow IPC file"
    with pytest.raises(ManifestError, match="not a readable Arrow IPC"):
        StoredShards.from_json(naming(m.to_json(), junk), junk)


def test_a_column_it_does_not_load_is_left_to_the_full_load() -> None:
    """The raw digest is not decoded here (a replica copies stored bytes); a reader's full load refuses it."""
    header, table = forged([flat(0), flat(1)], _set("raw_digest", [RAW, "bogus"]))
    got = StoredShards.from_json(header, table)
    assert got.stored_bytes.tolist() == [500, 501]
    with pytest.raises(ManifestError):
        Manifest.from_json(header, table)


@pytest.mark.parametrize(
    "path, ok",
    [("shards/a..b.arrow.zst", True), ("shards/a.", True), ("shards/../b", False), ("shards/a/..", False),
     ("shards/a\\b", False), ("shard/a", False)],
)  # fmt: skip
@pytest.mark.parametrize("loader", [StoredShards.from_json, Manifest.from_json], ids=["stored", "full"])
def test_paths_both_loads_accept_and_refuse(path: str, ok: bool, loader: Callable[[bytes, bytes], object]) -> None:
    """A ``..`` inside a name is no escape (the fast search's false alarm, cleared by the exact check); a
    ``..`` component or a backslash is."""
    rows = [flat(0), flat(1)]
    header, table = forged(rows, _set("path", [path, "shards/.b"]))
    if ok:
        loader(header, table)
    else:
        with pytest.raises(ManifestError, match="not under shards/"):
            loader(header, table)


def test_digest_column_round_trips_and_names_the_bad_row() -> None:
    """Digests become their 16 bytes a piece at a time; a bad one past the first piece is found and named."""
    rng = np.random.default_rng(7)
    raw = rng.integers(0, 256, size=(70_000, 16), dtype=np.uint8)
    texts = [f"xxh128:{row.tobytes().hex()}" for row in raw]
    got = digest_column(pa.array(texts, type=pa.string()))
    assert got.type == pa.binary(16) and np.frombuffer(got.buffers()[1], np.uint8).tobytes() == raw.tobytes()
    assert digest_strings(got.slice(69_990)) == texts[69_990:]
    assert digest_strings(digest_column(pa.array(texts, type=pa.string()).slice(3, 2))) == texts[3:5]
    texts[66_000] = texts[66_000][:-1] + "G"
    with pytest.raises(ManifestError, match=texts[66_000][-8:]):
        digest_column(pa.array(texts, type=pa.string()))


def test_a_table_of_several_record_batches_loads_the_same() -> None:
    """Each column is read on its own: one written as several batches is joined, its digests converted whole."""
    rows = [flat(i) for i in range(5)]
    m, data = build(rows)
    sink = pa.BufferOutputStream()
    table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    out = sink.getvalue().to_pybytes()
    header = naming(m.to_json(), out)
    got = StoredShards.from_json(header, out)
    assert got.paths.to_pylist() == Manifest.from_json(header, out).shards.paths == [r.path for r in rows]
    assert digest_strings(got.stored_digests) == [r.stored_digest for r in rows]
    assert got.stored_bytes.tolist() == [r.stored_bytes for r in rows]


@pytest.mark.parametrize(
    "offsets",
    [(0, 39, 117), (-39, 0, 39), (0, 78, 39), (0, 39, 2**31 - 1)],
    ids=["past-end", "negative", "back", "huge"],
)
@pytest.mark.parametrize("loader", [StoredShards.from_json, Manifest.from_json], ids=["stored", "full"])
def test_string_offsets_outside_their_data_are_refused(
    offsets: tuple[int, int, int], loader: Callable[[bytes, bytes], object]
) -> None:
    """A table whose digest columns' offsets point outside (or back into) its characters, published with a
    header naming it: refused as unreadable (the IPC reader trusts offsets; reading them would read
    memory that is not the column's)."""
    m, data = build([flat(0), flat(1)])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, pa.ipc.open_file(pa.py_buffer(data)).schema) as writer:  # uncompressed
        writer.write_table(pa.ipc.open_file(pa.py_buffer(data)).read_all())
    plain = sink.getvalue().to_pybytes()
    lengths = struct.pack("<3i", 0, len(STORED), 2 * len(STORED))  # the offsets of both digest columns
    assert plain.count(lengths) == 2
    table = plain.replace(lengths, struct.pack("<3i", *offsets))
    with pytest.raises(ManifestError, match="not a readable Arrow IPC"):
        loader(naming(m.to_json(), table), table)
