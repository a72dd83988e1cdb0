"""The replicas of one dataset: read its manifest and its stored shards from the first healthy one.

Replicas are given nearest first. A replica that fails (unreachable, missing shard,
digest mismatch) is tried last from then on in this process. Every stored shard is
checked against the manifest (size, stored digest, decompressed size and raw digest)
before its raw bytes are returned. Filesystems are resolved lazily per process, so
the object can be pickled into DataLoader workers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from shard_tools.dataset import decode_stored_shard, load_manifest
from shard_tools.errors import (
    DatasetError,
    DatasetNotFoundError,
    ShardError,
    ShardMissingError,
    StorageError,
    UsageError,
)
from shard_tools.manifest import Manifest, ShardInfo
from shard_tools.store import Location, resolve

from .checks import show

__all__ = ["Replicas"]


class Replicas:
    """One dataset at several URLs (nearest first)."""

    def __init__(
        self,
        urls: str | Sequence[str],
        storage_options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        self.urls = _urls(urls)
        if storage_options is None or isinstance(storage_options, Mapping):
            self.options = [dict(storage_options or {}) for _ in self.urls]
        else:
            plain = isinstance(storage_options, Sequence) and not isinstance(storage_options, (str, bytes))
            if not plain or not all(isinstance(o, Mapping) for o in storage_options):
                raise UsageError(f"storage_options must be a mapping or a list of them, got {show(storage_options)}")
            self.options = [dict(o) for o in storage_options]
            if len(self.options) != len(self.urls):
                raise UsageError(
                    f"storage_options has {len(self.options)} mappings for {len(self.urls)} URLs: "
                    "give one mapping for all, or one per URL"
                )
        self._order = list(range(len(self.urls)))
        self._locations: dict[int, Location] = {}
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_locations"] = {}  # filesystems are re-resolved in the receiving process
        return state

    def _location(self, i: int) -> Location:
        if self._pid != os.getpid():  # forked: do not share another process's connections
            self._locations = {}
            self._pid = os.getpid()
        loc = self._locations.get(i)
        if loc is None:
            loc = resolve(self.urls[i], self.options[i])
            self._locations[i] = loc
        return loc

    def _demote(self, i: int) -> None:
        self._order.remove(i)
        self._order.append(i)

    def load_manifest(self, version: str | None = None) -> Manifest:
        """The manifest from the first replica that serves a valid one."""
        errors: list[str] = []
        not_found = 0
        for i in list(self._order):
            try:
                return load_manifest(self._location(i), version)
            except DatasetNotFoundError as exc:
                not_found += 1
                errors.append(f"{self.urls[i]}: {exc}")
            except (DatasetError, StorageError) as exc:
                errors.append(f"{self.urls[i]}: {exc}")
            self._demote(i)
        detail = "; ".join(errors)
        if not_found == len(self.urls):
            raise DatasetNotFoundError(f"no ferry dataset at any of {self.urls}: {detail}")
        raise DatasetError(f"cannot read the dataset manifest from any replica: {detail}")

    def fetch(self, info: ShardInfo) -> bytes:
        """The verified raw (decompressed) bytes of a shard, from the first replica that has a good copy."""
        errors: list[str] = []
        kinds: set[type[ShardError]] = set()
        for i in list(self._order):
            try:
                stored = self._location(i).read_bytes(info.path)
                return decode_stored_shard(info, stored)
            except FileNotFoundError:
                errors.append(f"{self.urls[i]}: missing")
                kinds.add(ShardMissingError)
            except (ShardError, StorageError) as exc:
                errors.append(f"{self.urls[i]}: {exc}")
                kinds.add(type(exc) if isinstance(exc, ShardError) else ShardMissingError)
            self._demote(i)
        # every replica bad the same way (e.g. ShardFormatError: the manifest row itself lies): say so
        kind = kinds.pop() if len(kinds) == 1 else ShardMissingError
        raise kind(info.path, "no replica has a good copy: " + "; ".join(errors))


def _urls(urls: Any) -> list[str]:
    """One URL or a non-empty list of them (``str`` or ``os.PathLike``)."""
    many = isinstance(urls, Sequence) and not isinstance(urls, (str, bytes))
    out = [os.fspath(u) if isinstance(u, os.PathLike) else u for u in (urls if many else [urls])]
    if not out or not all(isinstance(u, str) and u.strip() and "\0" not in u for u in out):
        raise UsageError(f"url must be a dataset URL or a non-empty list of them, got {show(urls)}")
    return out
