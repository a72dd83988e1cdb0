"""``ferry verify``: re-read every shard of a dataset and check every digest and count.

A format-2 or format-3 shard is checked frame by frame first (index against the manifest, each frame
against the index, so a mismatch names the frame; in format 3 the index's leaves against the raw digest
and each decoded frame against its leaf), then as a whole like a format-1 one (the raw digest as the
manifest row's format computes it), and its index's Arrow positions against the decoded file.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .dataset import Dataset, decode_stored_shard, load_manifest
from .errors import DatasetError, ShardDigestError, ShardError, ShardFormatError, StorageError, TokenRangeError
from .format.digest import digest_bytes, raw_digest
from .format.manifest import ShardInfo
from .format.media import check_shard_media
from .format.seekable import arrow_positions, decode_frames, load_index
from .format.shard import parse_shard
from .storage.store import resolve

__all__ = ["VerifyReport", "verify", "verify_shard"]


@dataclass
class VerifyReport:
    """The outcome of a verification: ``bad`` maps shard path → reason."""

    url: str
    version_id: str | None
    shards: int = 0
    checked: int = 0
    bytes_read: int = 0
    bad: dict[str, str] = field(default_factory=dict)
    error: str | None = None  # the dataset itself could not be read

    @property
    def ok(self) -> bool:
        return self.error is None and not self.bad

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "version_id": self.version_id,
            "ok": self.ok,
            "shards": self.shards,
            "checked": self.checked,
            "bytes_read": self.bytes_read,
            "bad": self.bad,
            "error": self.error,
        }


def verify_shard(ds: Dataset, i: int) -> int:
    """Check shard ``i`` fully (size, digests, structure, counts, token range); returns bytes read."""
    m = ds.manifest
    info = m.shards[i]
    stored = ds.read_stored(i)
    positions = None
    if info.stored_format == 1:
        raw = decode_stored_shard(info, stored)
    else:
        raw, positions = _decode_seekable(info, stored)
    view = parse_shard(raw, shard=info.path, dtype=m.token_dtype, documents=info.documents, tokens=info.tokens)
    if positions is not None:
        _check_positions(info, raw, positions)
    check_shard_media(view.table, view.tokens, view.offsets, info, m.media)
    if view.num_tokens and int(np.max(view.tokens)) >= m.tokenizer.vocab_size:
        raise TokenRangeError(
            f"shard {info.path}: token id {int(np.max(view.tokens))} ≥ vocab size {m.tokenizer.vocab_size}"
        )
    return len(stored)


def _decode_seekable(info: ShardInfo, stored: bytes) -> tuple[bytes, tuple[int, int]]:
    """The raw bytes of a format-2 or format-3 shard, every frame and digest checked, naming the frame that
    fails."""
    if len(stored) != info.stored_bytes:
        raise ShardFormatError(
            info.path, f"stored size is {len(stored)} bytes, manifest says {info.stored_bytes} (truncated?)"
        )
    view = memoryview(stored)
    index = load_index(view[len(view) - info.index_bytes :], info)
    raw = decode_frames(view, index, info.raw_bytes, info.path)
    if digest_bytes(view) != info.stored_digest:
        raise ShardDigestError(info.path, "stored bytes do not match the manifest digest (corrupt copy)")
    if raw_digest(raw, info.frame_size) != info.raw_digest:
        raise ShardDigestError(info.path, "decompressed bytes do not match the manifest raw digest")
    return raw, (index.offsets_pos, index.tokens_pos)


def _check_positions(info: ShardInfo, raw: bytes, positions: tuple[int, int]) -> None:
    """The index's Arrow positions are the file's (after parse_shard validated it: nothing unbounded)."""
    try:
        found = arrow_positions(pa.py_buffer(raw))
    except ShardFormatError as exc:
        raise ShardFormatError(info.path, exc.reason) from exc
    if found != positions:
        raise ShardFormatError(
            info.path, f"frame index places the tokens column at {positions}, the Arrow file at {found}; re-pack it"
        )


def verify(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    version: str | None = None,
    threads: int = 4,
    on_shard: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify every shard of ``url``; never raises for bad shards, reports them instead."""
    loc = resolve(url, storage_options)
    report = VerifyReport(url=url, version_id=None)
    try:
        manifest = load_manifest(loc, version)
    except DatasetError as exc:
        report.error = str(exc)
        return report
    ds = Dataset(loc, manifest)
    report.version_id = manifest.version_id
    report.shards = len(ds)

    def one(i: int) -> tuple[int, int, str | None]:
        try:
            return i, verify_shard(ds, i), None
        except (ShardError, TokenRangeError, StorageError) as exc:
            return i, 0, str(exc)

    with cf.ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        for i, nbytes, err in pool.map(one, range(len(ds))):
            report.checked += 1
            report.bytes_read += nbytes
            if err is not None:
                report.bad[manifest.shards.paths[i]] = err
            if on_shard is not None:
                on_shard(nbytes)
    return report
