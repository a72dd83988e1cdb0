"""The dataset manifest: a small JSON header plus a columnar shard table (Arrow IPC).

Layout of a dataset root::

    manifest.json              the current version (a copy of versions/<id>.json), written last
    versions/<id>.json         every published version, immutable
    tables/<digest>.arrow      shard tables, content-addressed, immutable
    shards/<digest>.arrow.zst  shards, content-addressed, immutable (stored formats 2 and 3: <digest>.s2.arrow.zst,
                               <digest>.s3.arrow.zst)

The JSON header names the shard table by path and digest. The *version id* is the
digest of the canonical body: the header without ``version_id``, ``created_at`` and
``tool_version``, serialised with sorted keys and no whitespace. So the same content
gets the same id however and whenever it was packed, and any edit of the header or
the table is detected when it is read.

A shard's stored format is in its row: format 1 (one zstd frame) has ``index_bytes == 0`` and an empty
``index_digest``; format 2 (seekable frames, :mod:`ferry.shard_tools.format.seekable`) records the size and digest of
the frame index at the end of its stored bytes; format 3 (the same, its index carrying a digest of each
frame's raw bytes) records its frame size as well, and that frame size is what makes its raw digest
tree-shaped (:mod:`ferry.shard_tools.format.digest`): the row, not the shard, says how its raw digest is computed. A
table with only format-1 shards keeps the original seven columns (so its bytes, and the version id of a
format-1 pack, are what they always were); a table holding any format-2 shard has the two index columns
as well, and one holding any format-3 shard the ``frame_size`` column too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ManifestError
from .arrays import one_array, pool_for
from .digest import ALGORITHM, check_digest_string, digest_bytes
from .header import (
    MANIFEST_FORMAT,
    SHARDS_DIR,
    TABLES_DIR,
    parse_header,
    version_id_of,
)
from .policy import MediaPolicy
from .shard import MAX_FRAME_SIZE, MIN_FRAME_SIZE

__all__ = [
    "Tokenizer",
    "ShardInfo",
    "ShardTable",
    "Manifest",
    "StoredShards",
    "STORED_COLUMNS",
    "digest_column",
    "digest_strings",
    "next_lineage",
    "lineage_of",
]

_INT_COLUMNS = ("documents", "tokens", "stored_bytes", "raw_bytes")
_STR_COLUMNS = ("path", "stored_digest", "raw_digest")
#: the columns :class:`StoredShards` loads: what a replica needs to copy a version's shards and check them
STORED_COLUMNS = ("path", "stored_bytes", "stored_digest")
_SEARCH_PIECE = 1 << 22
_DIGEST_RE = r"^xxh128:[0-9a-f]{32}$"  # the form check_digest_string accepts
_DIGEST_PREFIX = np.frombuffer(f"{ALGORITHM}:".encode(), dtype=np.uint8)
_DIGEST_CHARS = len(_DIGEST_PREFIX) + 32  # a digest string's length: the prefix and 32 hex digits
_NOT_HEX = 0xFF
_NIBBLES = np.full(256, _NOT_HEX, dtype=np.uint8)  # an ASCII byte → its value as a lowercase hex digit
_NIBBLES[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)
_DIGEST_PIECE = 1 << 16  # rows converted at a time (bounds the temporary arrays)
_TABLE_SCHEMA = pa.schema(
    [("path", pa.string())]
    + [(c, pa.int64()) for c in _INT_COLUMNS]
    + [("stored_digest", pa.string()), ("raw_digest", pa.string())]
)
_INDEX_COLUMNS = [("index_bytes", pa.int64()), ("index_digest", pa.string())]
_TABLE_SCHEMA_2 = pa.schema(list(_TABLE_SCHEMA) + [pa.field(n, t) for n, t in _INDEX_COLUMNS])
_TABLE_SCHEMA_3 = pa.schema(list(_TABLE_SCHEMA_2) + [pa.field("frame_size", pa.int64())])
_MEDIA_COLUMNS = ("media_items", "media_bytes")
_TABLE_SCHEMA_4 = pa.schema(list(_TABLE_SCHEMA_3) + [pa.field(n, pa.int64()) for n in _MEDIA_COLUMNS])
_SCHEMAS = (_TABLE_SCHEMA, _TABLE_SCHEMA_2, _TABLE_SCHEMA_3, _TABLE_SCHEMA_4)  # each the one before with columns added


@dataclass(frozen=True)
class Tokenizer:
    """The tokenizer the ids come from: a name, the vocabulary size and the EOS id."""

    name: str
    vocab_size: int
    eos_id: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "vocab_size": self.vocab_size, "eos_id": self.eos_id}


@dataclass(frozen=True)
class ShardInfo:
    """One row of the shard table."""

    path: str
    documents: int
    tokens: int
    stored_bytes: int
    raw_bytes: int
    stored_digest: str
    raw_digest: str
    index_bytes: int = 0  # formats 2, 3: size of the frame index at the end of the stored bytes
    index_digest: str = ""  # formats 2, 3: its digest
    frame_size: int = 0  # format 3: raw bytes per frame, over which the raw digest is a tree (0: a flat digest)
    media_items: int = 0  # media items in the shard's media column (shard_tools.format.media)
    media_bytes: int = 0  # their encoded bytes

    @property
    def stored_format(self) -> int:
        """1: one zstd frame; 2: seekable frames with a frame index; 3: the same with a tree-shaped raw digest."""
        return 3 if self.frame_size else 2 if self.index_bytes else 1


class ShardTable:
    """The shard table, column by column (numpy for numbers), cheap at a million rows."""

    def __init__(self, table: pa.Table) -> None:
        level = next((i for i, schema in enumerate(_SCHEMAS) if table.schema.equals(schema)), None)
        if level is None:
            raise ManifestError(
                f"shard table schema is {table.schema}, expected {_TABLE_SCHEMA} (+ index columns, + frame_size)"
            )
        self._table = table.combine_chunks()
        # the size its checks choose their pool by (get_total_buffer_size: .nbytes allocates from the default pool)
        self._bytes = self._table.get_total_buffer_size()
        self._level = level
        self.seekable = level >= 1
        self.documents = self._column_int("documents")
        self.tokens = self._column_int("tokens")
        self.stored_bytes = self._column_int("stored_bytes")
        self.raw_bytes = self._column_int("raw_bytes")
        zeros = np.zeros(len(self.documents), dtype=np.int64)
        self.index_bytes = self._column_int("index_bytes") if self.seekable else zeros
        self.frame_size = self._column_int("frame_size") if level >= 2 else zeros
        self.has_media = level >= 3
        self.media_items = self._column_int("media_items") if self.has_media else zeros
        self.media_bytes = self._column_int("media_bytes") if self.has_media else zeros

    def _column_int(self, name: str) -> np.ndarray:
        arr = self._table.column(name)
        if arr.null_count:
            raise ManifestError(f"shard table column {name!r} has nulls")
        values = _ints(arr)
        if len(values) and int(values.min()) < 0:
            row = int(np.argmax(values < 0))  # name the first bad row: the table may hold a million
            path = self._table.column("path")[row].as_py()
            raise ManifestError(
                f"shard table column {name!r} has negative values (shard {path}: {int(values[row])}); "
                "the manifest is corrupt or was tampered with"
            )
        return values

    @classmethod
    def from_rows(cls, rows: Iterable[ShardInfo], *, media: bool = False) -> ShardTable:
        """A table of ``rows``; with ``media`` (a dataset packed with media) it has the media columns."""
        rows = list(rows)
        level = max([2 if r.frame_size else 1 if r.index_bytes else 0 for r in rows], default=0)
        schema = _SCHEMAS[3 if media or any(r.media_items or r.media_bytes for r in rows) else level]
        data: dict[str, list[Any]] = {name: [getattr(r, name) for r in rows] for name in schema.names}
        return cls(pa.Table.from_pydict(data, schema=schema))

    def _widened(self, level: int) -> pa.Table:
        """The table with the columns of schema ``level`` it lacks (0 / "" on every row)."""
        table, n = self._table, len(self)
        for name in _SCHEMAS[level].names[len(table.schema) :]:
            column = pa.array([""] * n, type=pa.string()) if name == "index_digest" else pa.array(np.zeros(n, np.int64))
            table = table.append_column(name, column)
        return table

    @classmethod
    def empty(cls) -> ShardTable:
        return cls.from_rows([])

    def concat(self, other: ShardTable) -> ShardTable:
        level = max(self._level, other._level)
        return ShardTable(pa.concat_tables([self._widened(level), other._widened(level)]))

    def __len__(self) -> int:
        return self._table.num_rows

    @cached_property
    def paths(self) -> list[str]:
        return [str(p) for p in self._table.column("path").to_pylist()]

    @cached_property
    def _digests(self) -> tuple[list[str], list[str]]:
        return (
            [str(d) for d in self._table.column("stored_digest").to_pylist()],
            [str(d) for d in self._table.column("raw_digest").to_pylist()],
        )

    @cached_property
    def _index_digests(self) -> list[str]:
        if not self.seekable:
            return [""] * len(self)
        return [str(d) for d in self._table.column("index_digest").to_pylist()]

    def _index_digest(self, i: int) -> str:
        if "_index_digests" in self.__dict__:
            return self._index_digests[i]
        return str(self._table.column("index_digest")[i].as_py()) if self.index_bytes[i] else ""

    def __getitem__(self, i: int) -> ShardInfo:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"shard index {i} out of range for {n} shards")
        i %= n
        if "paths" in self.__dict__ and "_digests" in self.__dict__:
            path, (stored, raw) = self.paths[i], self._digests
            stored_digest, raw_digest = stored[i], raw[i]
        else:  # one row: read the Arrow columns, not whole-table Python lists (slow and large at 1M rows)
            path, stored_digest, raw_digest = (str(self._table.column(c)[i].as_py()) for c in _STR_COLUMNS)
        return ShardInfo(
            path=path,
            documents=int(self.documents[i]),
            tokens=int(self.tokens[i]),
            stored_bytes=int(self.stored_bytes[i]),
            raw_bytes=int(self.raw_bytes[i]),
            stored_digest=stored_digest,
            raw_digest=raw_digest,
            index_bytes=int(self.index_bytes[i]),
            index_digest=self._index_digest(i),
            frame_size=int(self.frame_size[i]),
            media_items=int(self.media_items[i]),
            media_bytes=int(self.media_bytes[i]),
        )

    def __iter__(self) -> Iterator[ShardInfo]:
        self.paths, self._digests, self._index_digests  # noqa: B018 - build the lists once: fast rows for a scan
        return (self[i] for i in range(len(self)))

    @cached_property
    def token_offsets(self) -> np.ndarray:
        """``n + 1`` cumulative token counts: shard ``i`` holds stream tokens
        ``[token_offsets[i], token_offsets[i + 1])``."""
        out = np.zeros(len(self) + 1, dtype=np.int64)
        np.cumsum(self.tokens, out=out[1:])
        return out

    def validate(self) -> None:
        """Check every path and digest string (done once when a manifest is loaded)."""
        if self.seekable:
            self._validate_index_columns()
        _check_strings(
            self._table.column("path"),
            self._table.column("stored_digest"),
            self._table.column("raw_digest"),
            pool=pool_for(self._bytes),
        )

    def _validate_index_columns(self) -> None:
        """Format 2 and 3 rows name a digest and an index inside the stored bytes, format 1 rows neither; only
        rows with an index have a frame size, one ferry writes (the raw digest is hashed in frames of it)."""
        col = self._table.column("index_digest")
        if col.null_count:
            raise ManifestError("shard table column 'index_digest' has nulls; the manifest is corrupt")
        # a digest or nothing on every row, a digest exactly where there is an index (all without
        # to_numpy on Arrow arrays, which imports pandas, a visible part of a cold start)
        pattern = _DIGEST_RE[:1] + "(" + _DIGEST_RE[1:-1] + ")?$"
        pool = pool_for(self._bytes)
        matches = pc.match_substring_regex(col, pattern, memory_pool=pool)
        forms = pc.all(matches, memory_pool=pool).as_py()
        has_digest = _ints(pc.utf8_length(col, memory_pool=pool)) > 0
        bad = np.flatnonzero(
            ((self.index_bytes > 0) != has_digest)
            | (self.index_bytes > self.stored_bytes)
            | ((self.frame_size > 0) & (self.index_bytes == 0))
            | ((self.frame_size != 0) & ((self.frame_size < MIN_FRAME_SIZE) | (self.frame_size > MAX_FRAME_SIZE)))
        )
        if forms is False:  # the slow path only on failure, to name the row
            ok = re.compile(_DIGEST_RE)
            bad = np.union1d(bad, [i for i, d in enumerate(self._index_digests) if d and not ok.match(d)])
        if len(bad):
            row = int(bad[0])
            raise ManifestError(
                f"shard table row {row} ({self.paths[row]}): index_bytes {int(self.index_bytes[row])}, "
                f"index_digest {col[row].as_py()!r} and frame_size {int(self.frame_size[row])} disagree; the "
                "manifest is corrupt or was tampered with"
            )

    def to_ipc(self) -> bytes:
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_file(sink, self._table.schema, options=options) as writer:
            writer.write_table(self._table)
        return sink.getvalue().to_pybytes()

    @classmethod
    def from_ipc(cls, data: bytes) -> ShardTable:
        pool = pool_for(len(data))
        try:
            table = pa.ipc.open_file(pa.py_buffer(data), memory_pool=pool).read_all()
            table.validate(full=True)  # offsets inside their buffers, in order, UTF-8: the IPC reader trusts them
        except pa.ArrowException as exc:
            raise ManifestError(f"shard table is not a readable Arrow IPC file ({exc})") from exc
        return cls(table)


@dataclass(frozen=True)
class Manifest:
    """One published version of a dataset. Build with :meth:`build`, read with :meth:`from_json`."""

    name: str
    token_dtype: str
    tokenizer: Tokenizer
    eos_appended: bool
    shards: ShardTable = field(repr=False)
    table_path: str
    table_digest: str
    table_bytes: int
    parent: str | None
    created_at: str
    tool_version: str
    version_id: str
    lineage: dict[str, Any] | None = field(default=None, repr=False)  # see next_lineage; None: a root
    media: MediaPolicy | None = None  # the media cost policy of a dataset packed with media (format.policy)

    def child_lineage(self) -> dict[str, Any]:
        """The lineage of a version whose parent is this one."""
        return next_lineage(self.version_id, self.lineage)

    @classmethod
    def build(
        cls,
        *,
        name: str,
        token_dtype: str,
        tokenizer: Tokenizer,
        eos_appended: bool,
        shards: ShardTable,
        parent: str | None,
        created_at: str,
        tool_version: str,
        lineage: dict[str, Any] | None = None,
        media: MediaPolicy | None = None,
    ) -> tuple[Manifest, bytes]:
        """A new manifest and the IPC bytes of its shard table (to be stored at ``table_path``);
        ``lineage`` is the parent's :meth:`child_lineage` (None only without a parent)."""
        table_data = shards.to_ipc()
        table_digest = digest_bytes(table_data)
        table_path = f"{TABLES_DIR}/{table_digest.split(':', 1)[1]}.arrow"
        draft = cls(
            name=name,
            token_dtype=token_dtype,
            tokenizer=tokenizer,
            eos_appended=eos_appended,
            shards=shards,
            table_path=table_path,
            table_digest=table_digest,
            table_bytes=len(table_data),
            parent=parent,
            created_at=created_at,
            tool_version=tool_version,
            version_id="",
            lineage=lineage,
            media=media,
        )
        version_id = version_id_of(draft.body())
        return _replace_version(draft, version_id), table_data

    @property
    def totals(self) -> dict[str, int]:
        t = self.shards
        media = {"media_items": int(t.media_items.sum()), "media_bytes": int(t.media_bytes.sum())}
        return {
            "shards": len(t),
            "documents": int(t.documents.sum()),
            "tokens": int(t.tokens.sum()),
            "stored_bytes": int(t.stored_bytes.sum()),
            "raw_bytes": int(t.raw_bytes.sum()),
            **(media if t.has_media else {}),
        }

    def body(self) -> dict[str, Any]:
        """The digested part of the header."""
        return {
            "format": MANIFEST_FORMAT,
            "name": self.name,
            "token_dtype": self.token_dtype,
            "tokenizer": self.tokenizer.to_dict(),
            "eos_appended": self.eos_appended,
            "totals": self.totals,
            "shard_table": {"path": self.table_path, "digest": self.table_digest, "bytes": self.table_bytes},
            "parent": self.parent,
            **({"lineage": self.lineage} if self.lineage is not None else {}),
            **({"media": {"policy": self.media.to_dict()}} if self.media is not None else {}),
        }

    def to_json(self) -> bytes:
        doc = {
            "version_id": self.version_id,
            **self.body(),
            "created_at": self.created_at,
            "tool_version": self.tool_version,
        }
        return (json.dumps(doc, indent=1, sort_keys=False) + "\n").encode()

    @classmethod
    def parse_header(cls, data: bytes) -> dict[str, Any]:
        """Parse and check the JSON header alone (no shard table); see
        :func:`ferry.shard_tools.format.header.parse_header`."""
        return parse_header(data)

    @classmethod
    def from_json(cls, data: bytes, table_data: bytes) -> Manifest:
        """Build a manifest from its header and the bytes of its shard table, checking both."""
        doc = cls.parse_header(data)
        st = doc["shard_table"]
        if digest_bytes(table_data) != st["digest"] or len(table_data) != st["bytes"]:
            raise ManifestError(f"shard table {st['path']} does not match its digest in the manifest")
        shards = ShardTable.from_ipc(table_data)
        shards.validate()
        tok = doc["tokenizer"]
        manifest = cls(
            name=doc["name"],
            token_dtype=doc["token_dtype"],
            tokenizer=Tokenizer(tok["name"], tok["vocab_size"], tok["eos_id"]),
            eos_appended=doc["eos_appended"],
            shards=shards,
            table_path=st["path"],
            table_digest=st["digest"],
            table_bytes=st["bytes"],
            parent=doc["parent"],
            created_at=doc["created_at"],
            tool_version=doc["tool_version"],
            version_id=doc["version_id"],
            lineage=lineage_of(doc),
            media=_media_of(doc, shards),
        )
        if manifest.totals != doc["totals"]:
            raise ManifestError(f"manifest totals {doc['totals']} do not match its shard table {manifest.totals}")
        return manifest


@dataclass(frozen=True)
class StoredShards:
    """One version's header and the stored-shard columns of its table alone (:data:`STORED_COLUMNS`): each
    shard's path, stored size and stored digest, in manifest order, as Arrow and numpy arrays.

    What a replication daemon plans, copies and publishes with, at a fraction of a :class:`Manifest`'s memory
    and load time: the other columns are never decompressed, and the digests are held as their 16 bytes
    (``digest_strings`` gives the strings back). The table's bytes are checked against the header's digest as
    a full load does, then the loaded columns (nulls, paths, digests, negative sizes) and the totals they
    carry (shard count, stored bytes); the columns not loaded are covered by the table's digest only, and a
    reader's full load checks them.
    """

    version_id: str
    header: bytes = field(repr=False)  # the manifest.json bytes, as read
    table_path: str
    table_digest: str
    created_at: str
    lineage: dict[str, Any] | None = field(repr=False)
    paths: pa.StringArray = field(repr=False)
    stored_bytes: np.ndarray = field(repr=False)  # int64
    stored_digests: pa.FixedSizeBinaryArray = field(repr=False)  # the 16 bytes of each xxh128 digest

    def __len__(self) -> int:
        return len(self.stored_bytes)

    def to_json(self) -> bytes:
        """The header, as read (what a replica publishes)."""
        return self.header

    @classmethod
    def from_json(cls, data: bytes, table_data: bytes) -> StoredShards:
        """The header ``data`` and the stored-shard columns of the shard table ``table_data``, checked.

        The columns are decoded one at a time, the digests first (their strings dropped once converted), so
        that at most one column's strings exist beside the table's bytes at once."""
        doc = parse_header(data)
        st = doc["shard_table"]
        if digest_bytes(table_data) != st["digest"] or len(table_data) != st["bytes"]:
            raise ManifestError(f"shard table {st['path']} does not match its digest in the manifest")
        schema = _table_schema(table_data)
        digests = digest_column(_string_array(_read_column(table_data, schema, "stored_digest")))
        stored = _ints(_read_column(table_data, schema, "stored_bytes"))
        if len(stored) and int(stored.min()) < 0:
            raise ManifestError("shard table column 'stored_bytes' has negative values; the manifest is corrupt")
        totals = doc["totals"]
        if (len(stored), int(stored.sum())) != (totals.get("shards"), totals.get("stored_bytes")):
            raise ManifestError(
                f"manifest totals {totals} do not match its shard table ({len(stored)} shards, "
                f"{int(stored.sum())} stored bytes)"
            )
        paths = _read_column(table_data, schema, "path")
        _check_strings(paths, pool=pool_for(len(table_data)))
        return cls(
            version_id=doc["version_id"],
            header=data,
            table_path=st["path"],
            table_digest=st["digest"],
            created_at=doc["created_at"],
            lineage=lineage_of(doc),
            paths=_string_array(paths),
            stored_bytes=stored,
            stored_digests=digests,
        )


def digest_column(column: pa.StringArray) -> pa.FixedSizeBinaryArray:
    """Digest strings (``xxh128:<32 hex>``, as a manifest holds them) as their 16 bytes each, in order;
    ManifestError naming the first row that is null or not of that form. Vectorised, a piece at a time."""
    n = len(column)
    if column.null_count:
        row = column.to_pylist().index(None)
        raise ManifestError(f"shard table row {row} has a null digest (None); the manifest is corrupt")
    out = np.empty((n, 16), dtype=np.uint8)
    if n:
        offsets = np.frombuffer(column.buffers()[1], dtype=np.int32, count=n + 1, offset=column.offset * 4)
        lengths = np.diff(offsets)
        if not bool(np.all(lengths == _DIGEST_CHARS)):
            _bad_digest(column, np.flatnonzero(lengths != _DIGEST_CHARS))
        data = column.buffers()[2]
        assert data is not None  # n values of _DIGEST_CHARS bytes each
        chars = np.frombuffer(data, dtype=np.uint8, count=n * _DIGEST_CHARS, offset=int(offsets[0]))
        chars = chars.reshape(n, _DIGEST_CHARS)
        for start in range(0, n, _DIGEST_PIECE):
            piece = chars[start : start + _DIGEST_PIECE]
            nibbles = _NIBBLES[piece[:, len(_DIGEST_PREFIX) :]]
            bad = np.any(piece[:, : len(_DIGEST_PREFIX)] != _DIGEST_PREFIX, axis=1) | np.any(
                nibbles == _NOT_HEX, axis=1
            )
            if bad.any():
                _bad_digest(column, start + np.flatnonzero(bad))
            out[start : start + len(piece)] = (nibbles[:, 0::2] << 4) | nibbles[:, 1::2]
    binary = pa.Array.from_buffers(pa.binary(16), n, [None, pa.py_buffer(out)])
    assert isinstance(binary, pa.FixedSizeBinaryArray)
    return binary


def _bad_digest(column: pa.StringArray, rows: np.ndarray) -> NoReturn:
    """Raise the ManifestError ``check_digest_string`` gives for the first of ``rows``."""
    value = column[int(rows[0])].as_py()
    check_digest_string(value)  # raises: the row is not of that form
    raise AssertionError(f"digest {value!r} flagged but of the right form")


def digest_strings(column: pa.FixedSizeBinaryArray) -> list[str]:
    """The digest strings (``xxh128:<32 hex>``) of a column ``digest_column`` made (for a few rows)."""
    return [f"{ALGORITHM}:{raw.hex()}" for raw in column.to_pylist()]


def _table_schema(table_data: bytes) -> pa.Schema:
    """A shard table's schema (its footer alone), checked to be one ferry writes."""
    try:
        schema = pa.ipc.open_file(pa.py_buffer(table_data)).schema
    except pa.ArrowException as exc:
        raise ManifestError(f"shard table is not a readable Arrow IPC file ({exc})") from exc
    if not any(schema.equals(s) for s in _SCHEMAS):
        raise ManifestError(f"shard table schema is {schema}, expected {_TABLE_SCHEMA} (+ index columns, + frame_size)")
    return schema


def _read_column(table_data: bytes, schema: pa.Schema, name: str) -> pa.ChunkedArray:
    """The column ``name`` of a shard table's IPC bytes, decoding no other column. Arrow's pool hands back
    what is free before and after the read (the reader copies the column's compressed ranges into a buffer
    the size of the whole body; a column converted since leaves its strings): otherwise those pages would
    stay beside the next column's."""
    pool = pa.default_memory_pool()
    pool.release_unused()
    try:
        options = pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index(name)])
        column = pa.ipc.open_file(pa.py_buffer(table_data), options=options).read_all().column(name)
        column.validate(full=True)  # offsets inside their buffers, in order, UTF-8: the IPC reader trusts them
    except pa.ArrowException as exc:
        raise ManifestError(f"shard table is not a readable Arrow IPC file ({exc})") from exc
    pool.release_unused()
    return column


def _string_array(column: pa.ChunkedArray) -> pa.StringArray:
    """The column as one array (its one chunk itself where it has one)."""
    chunk = one_array(column)
    if not isinstance(chunk, pa.StringArray):
        raise ManifestError(f"shard table column of type {column.type} where strings were expected")
    return chunk


def next_lineage(parent: str, parent_lineage: dict[str, Any] | None) -> dict[str, Any]:
    """The lineage of a child of version ``parent`` (whose own lineage is ``parent_lineage``).

    A lineage places a version in a chain of generations counted from its *root*: the nearest
    ancestor without a lineage (a dataset's first version, or one written before lineages), at
    generation 0. ``up`` lists ancestors as ``[generation, id]``, newest first: the parent (g-1)
    and, for every k ≥ 1, the ancestor at generation ``((g-1) >> k) << k``, so about log2(g)
    entries. Each comes from the parent's lineage alone, and walking from any version to any
    generation below it takes at most one record per bit of the distance
    (:func:`ferry.shard_tools.storage.publish.descends_from`)."""
    if parent_lineage is None:
        return {"gen": 1, "root": parent, "up": [[0, parent]]}
    pgen = int(parent_lineage["gen"])
    known = {int(g): str(v) for g, v in parent_lineage["up"]}
    known[pgen] = parent
    known[0] = str(parent_lineage["root"])
    gen = pgen + 1
    wanted = sorted({pgen} | {(pgen >> k) << k for k in range(1, pgen.bit_length() + 1)}, reverse=True)
    missing = [g for g in wanted if g not in known]
    if missing:
        raise ManifestError(f"lineage of version {parent} lacks generation {missing[0]} (hand-edited?)")
    return {"gen": gen, "root": known[0], "up": [[g, known[g]] for g in wanted]}


def lineage_of(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The checked ``lineage`` of a parsed header (None when it has none); ManifestError if malformed."""
    lin = doc.get("lineage")
    if lin is None:
        return None
    try:
        gen, root, up = lin["gen"], lin["root"], lin["up"]
        ok = isinstance(gen, int) and not isinstance(gen, bool) and gen >= 1 and isinstance(root, str)
        ok = ok and isinstance(up, list) and 0 < len(up) <= 64
        pairs = [(int(g), str(v)) for g, v in up] if ok else []
        gens = [g for g, _ in pairs]
        ok = ok and all(isinstance(g, int) and isinstance(v, str) for g, v in up)
        ok = ok and gens == sorted(set(gens), reverse=True) and gens[0] == gen - 1 and gens[-1] == 0
        ok = ok and pairs[0][1] == doc.get("parent") and pairs[-1][1] == root
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise ManifestError(f"manifest {doc.get('version_id')}: malformed lineage")
    return {"gen": gen, "root": root, "up": [list(p) for p in pairs]}


def _media_of(doc: dict[str, Any], shards: ShardTable) -> MediaPolicy | None:
    """The checked media policy of a parsed header (None for a dataset without media)."""
    media = doc.get("media")
    if media is None:
        if shards.has_media:
            raise ManifestError("the shard table has media columns, the manifest no media policy")
        return None
    if not isinstance(media, dict) or set(media) != {"policy"}:
        raise ManifestError(f"manifest field 'media' is malformed: {media!r}")
    return MediaPolicy.from_dict(media["policy"])


def _check_strings(paths: pa.ChunkedArray, *digests: pa.ChunkedArray, pool: pa.MemoryPool) -> None:
    """Every path under ``shards/`` (no ``..``, no backslash) and every digest well formed, else ManifestError.

    Vectorised first (a per-row Python loop is slow at a million shards); the loop then runs only on
    failure, to name the offending value."""
    ok_digests = all(
        pc.all(pc.match_substring_regex(d, _DIGEST_RE, memory_pool=pool), memory_pool=pool).as_py() is not False
        for d in digests
    )
    no_nulls = all(c.null_count == 0 for c in (paths, *digests))
    under = pc.all(pc.starts_with(paths, f"{SHARDS_DIR}/", memory_pool=pool), memory_pool=pool).as_py() is not False
    if no_nulls and under and ok_digests and not any(_has_dots_or_backslash(c) for c in paths.chunks):
        return
    for path in paths.to_pylist():
        if (
            not isinstance(path, str)
            or not path.startswith(f"{SHARDS_DIR}/")
            or ".." in path.split("/")
            or "\\" in path
        ):
            raise ManifestError(f"shard path {path!r} is not under {SHARDS_DIR}/")
    for column in digests:
        for row, d in enumerate(column.to_pylist()):
            if d is None:
                raise ManifestError(f"shard table row {row} has a null digest (None); the manifest is corrupt")
            check_digest_string(d)


def _has_dots_or_backslash(column: pa.Array) -> bool:
    """Whether a ``..`` or a backslash is anywhere in the string column's characters: one search of its data
    buffer (a ``..`` across two values, or inside a name, is a false alarm the caller's exact check clears)."""
    if len(column) == 0:
        return False
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32, count=len(column) + 1, offset=column.offset * 4)
    data = column.buffers()[2]
    if data is None:
        return False
    chars, start, stop = memoryview(data), int(offsets[0]), int(offsets[-1])
    for at in range(start, stop, _SEARCH_PIECE):  # bytes searches (memmem), a piece at a time: no big copy
        piece = bytes(chars[at : min(at + _SEARCH_PIECE + 1, stop)])  # + 1: a ".." across two pieces
        if b".." in piece or b"\\" in piece:
            return True
    return False


def _ints(arr: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A null-free integer Arrow column as numpy, read from its data buffer (``to_numpy`` imports pandas)."""
    chunk = one_array(arr)
    dtype = np.dtype(chunk.type.to_pandas_dtype()).newbyteorder("<")
    if len(chunk) == 0:
        return np.zeros(0, dtype=dtype)
    data = chunk.buffers()[1]
    return np.frombuffer(data, dtype=dtype, count=len(chunk), offset=chunk.offset * dtype.itemsize)


def _replace_version(m: Manifest, version_id: str) -> Manifest:
    from dataclasses import replace

    return replace(m, version_id=version_id)
