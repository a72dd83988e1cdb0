"""Reading a published dataset: its manifest, its shards, its documents."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .errors import (
    DatasetNotFoundError,
    ManifestError,
    ShardDigestError,
    ShardFormatError,
    ShardMissingError,
)
from .format.digest import digest_bytes, raw_digest
from .format.header import MANIFEST_FILE, VERSIONS_DIR, version_path
from .format.manifest import Manifest, ShardInfo
from .format.shard import ShardView, decompress, parse_shard
from .storage.store import Location, resolve

__all__ = ["Dataset", "open_dataset", "load_manifest", "decode_stored_shard", "list_versions"]


def load_manifest(loc: Location, version: str | None = None) -> Manifest:
    """Read and check the current manifest (or one published version) and its shard table."""
    rel = MANIFEST_FILE if version is None else version_path(version)
    try:
        header = loc.read_bytes(rel)
    except FileNotFoundError as exc:
        if version is None:
            raise DatasetNotFoundError(f"no {MANIFEST_FILE} at {loc.url}: not a ferry dataset (yet)") from exc
        raise DatasetNotFoundError(f"version {version} is not published at {loc.url}") from exc
    doc = Manifest.parse_header(header)
    table_rel = doc["shard_table"]["path"]
    try:
        table = loc.read_bytes(table_rel)
    except FileNotFoundError as exc:
        raise ManifestError(f"shard table {table_rel} named by the manifest is missing at {loc.url}") from exc
    return Manifest.from_json(header, table)


def list_versions(loc: Location) -> list[str]:
    """Ids of every version published at ``loc`` (unordered by time: read each for its parent)."""
    return [n[: -len(".json")] for n in loc.listdir(VERSIONS_DIR) if n.endswith(".json")]


def decode_stored_shard(info: ShardInfo, stored: bytes, *, verify: bool = True) -> bytes:
    """Check the stored bytes of a shard against its manifest row and return the raw bytes."""
    if len(stored) != info.stored_bytes:
        raise ShardFormatError(
            info.path, f"stored size is {len(stored)} bytes, manifest says {info.stored_bytes} (truncated?)"
        )
    if verify and digest_bytes(stored) != info.stored_digest:
        raise ShardDigestError(info.path, "stored bytes do not match the manifest digest (corrupt copy)")
    raw = decompress(stored, info.raw_bytes, info.path)
    if verify and raw_digest(raw, info.frame_size) != info.raw_digest:
        raise ShardDigestError(info.path, "decompressed bytes do not match the manifest raw digest")
    return raw


class Dataset:
    """A published dataset version opened for reading."""

    def __init__(self, location: Location, manifest: Manifest) -> None:
        self.location = location
        self.manifest = manifest

    def __repr__(self) -> str:
        return f"Dataset({self.location.url!r}, version={self.manifest.version_id}, shards={len(self)})"

    def __len__(self) -> int:
        return len(self.manifest.shards)

    @property
    def url(self) -> str:
        return self.location.url

    @property
    def version_id(self) -> str:
        return self.manifest.version_id

    def read_stored(self, i: int) -> bytes:
        """The stored (compressed) bytes of shard ``i``, unverified."""
        info = self.manifest.shards[i]
        try:
            return self.location.read_bytes(info.path)
        except FileNotFoundError as exc:
            raise ShardMissingError(info.path, f"listed in the manifest but missing at {self.url}") from exc

    def read_shard(self, i: int, *, verify: bool = True) -> ShardView:
        """Fetch, check and decode shard ``i`` in memory."""
        info = self.manifest.shards[i]
        raw = decode_stored_shard(info, self.read_stored(i), verify=verify)
        return parse_shard(
            raw, shard=info.path, dtype=self.manifest.token_dtype, documents=info.documents, tokens=info.tokens
        )

    def tokens(self) -> Iterator[np.ndarray]:
        """The dataset's token stream (what the loader cuts samples from), one verified shard
        at a time: each shard's flat tokens, EOS included where it was appended."""
        for i in range(len(self)):
            yield self.read_shard(i).tokens

    def documents(self, *, strip_eos: bool = True) -> Iterator[np.ndarray]:
        """Every document in manifest order. With ``strip_eos`` the EOS appended at pack time
        is removed, giving back exactly the tokens that were put in."""
        strip = strip_eos and self.manifest.eos_appended
        for i in range(len(self)):
            view = self.read_shard(i)
            for d in range(view.num_documents):
                doc = view.document(d)
                yield doc[:-1] if strip else doc


def open_dataset(url: str, *, storage_options: Mapping[str, Any] | None = None, version: str | None = None) -> Dataset:
    """Open the dataset at ``url`` (any fsspec URL); ``version`` picks a published version."""
    loc = resolve(url, storage_options)
    return Dataset(loc, load_manifest(loc, version))
