"""``ferry verify``: re-read every shard of a dataset and check every digest and count."""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dataset import Dataset, decode_stored_shard, load_manifest
from .errors import DatasetError, ShardError, StorageError, TokenRangeError
from .format import parse_shard
from .store import resolve

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
    raw = decode_stored_shard(info, stored)
    view = parse_shard(raw, shard=info.path, dtype=m.token_dtype, documents=info.documents, tokens=info.tokens)
    if view.num_tokens and int(np.max(view.tokens)) >= m.tokenizer.vocab_size:
        raise TokenRangeError(
            f"shard {info.path}: token id {int(np.max(view.tokens))} ≥ vocab size {m.tokenizer.vocab_size}"
        )
    return len(stored)


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
