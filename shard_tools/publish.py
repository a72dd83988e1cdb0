"""Publishing a version: shard table, then ``versions/<id>.json``, then ``manifest.json`` last.

Shards must already be stored. A reader that sees the new ``manifest.json`` therefore
finds every shard it names; a crash before the last write leaves the old version current.

``manifest.json`` is replaced by compare-and-swap (:mod:`.conditional`): a writer reads the
current version, decides what to publish on top of it, and the write succeeds only if
nothing changed in between. On a conflict the writer decides again against the new current
version (``swap_manifest``), so two writers never silently drop each other's versions.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any

from .conditional import read_versioned, write_if
from .errors import ManifestError, PublishError, StorageError, WriteConflictError
from .header import MANIFEST_FILE, parse_header, version_path
from .manifest import Manifest
from .store import Location

__all__ = ["publish_version", "current_version_id", "swap_manifest", "store_version", "descends_from"]

#: Conflicting writers each win one round, so this many rounds means something is wrong.
SWAP_ATTEMPTS = 64
_MAX_CHAIN = 1_000_000


def current_version_id(loc: Location) -> str | None:
    """The version id ``manifest.json`` names now, or None where there is none."""
    try:
        data = loc.read_bytes(MANIFEST_FILE)
    except FileNotFoundError:
        return None
    return str(Manifest.parse_header(data)["version_id"])


def _check_stored(loc: Location, paths: Sequence[str]) -> None:
    """Every path must exist: one HEAD each for a few, one listing per directory for many."""
    unique = sorted(set(paths))
    if len(unique) <= 64:
        missing = [p for p in unique if not loc.exists(p)]
    else:
        listed: dict[str, set[str]] = {}
        missing = []
        for p in unique:
            head, _, name = p.rpartition("/")
            if head not in listed:
                listed[head] = set(loc.listdir(head))
            if name not in listed[head]:
                missing.append(p)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise PublishError(f"refusing to publish: shard {missing[0]}{more} not stored at {loc.url}")


def store_version(loc: Location, manifest: Manifest, table_data: bytes, body: bytes | None = None) -> bytes:
    """Store a version's shard table and ``versions/<id>.json`` (immutable, named by content);
    returns the manifest body. Safe to repeat and to race: both writers write the same bytes."""
    if not loc.exists(manifest.table_path):
        loc.write_bytes(manifest.table_path, table_data)
    body = manifest.to_json() if body is None else body
    loc.write_bytes(version_path(manifest.version_id), body)
    return body


def swap_manifest(loc: Location, choose: Callable[[dict[str, Any] | None], bytes | None]) -> bytes | None:
    """Replace ``manifest.json`` by compare-and-swap.

    ``choose`` gets the current header (None: no dataset, or a manifest.json too damaged to
    parse) and returns the body to publish on top of it, or None to publish nothing; it may
    raise to refuse. If another writer replaced the manifest meanwhile, ``choose`` is asked
    again about the new one. Returns what was published (None: nothing)."""
    for attempt in range(SWAP_ATTEMPTS):
        current = read_versioned(loc, MANIFEST_FILE)
        doc: dict[str, Any] | None = None
        if current.data is not None:
            try:
                doc = parse_header(current.data)
            except ManifestError:
                doc = None  # a torn or hand-damaged manifest.json is replaced like a missing one
        body = choose(doc)
        if body is None:
            return None
        try:
            write_if(loc, MANIFEST_FILE, body, current.token)
            return body
        except WriteConflictError:
            time.sleep(random.uniform(0, min(0.2, 0.005 * 2**attempt)))  # let the winner finish
    raise PublishError(f"{loc.url}: manifest.json kept changing under {SWAP_ATTEMPTS} attempts; nothing was published")


def publish_version(
    loc: Location,
    manifest: Manifest,
    table_data: bytes,
    *,
    expect_current: str | None,
    new_shards: Sequence[str] = (),
    rebase: Callable[[str], tuple[Manifest, bytes]] | None = None,
) -> Manifest:
    """Make ``manifest`` (built on ``expect_current``, None for a new dataset) current at ``loc``.

    If ``manifest.json`` names another version by the time of the swap, ``rebase`` (when given)
    builds an equivalent version on top of that one — called with its id, returning the new
    manifest and table — and that is published instead; without ``rebase`` nothing is
    published and PublishError is raised. ``new_shards`` are checked to exist first (old ones
    were checked when their version was published). Returns the manifest published."""
    _check_stored(loc, new_shards)
    chosen = [manifest]
    body = store_version(loc, manifest, table_data)

    def choose(doc: dict[str, Any] | None) -> bytes:
        now = None if doc is None else str(doc["version_id"])
        if now == expect_current:
            chosen[0] = manifest
            return body
        if rebase is None or now is None:
            raise PublishError(
                f"{loc.url} changed while packing (current version {now}, expected {expect_current}); "
                "nothing was published" + ("; pass --append to add to it" if expect_current is None else ", run again")
            )
        rebased, table = rebase(now)
        chosen[0] = rebased
        return store_version(loc, rebased, table)

    swap_manifest(loc, choose)
    return chosen[0]


def _parent_of(locs: Sequence[Location], version: str) -> tuple[bool, str | None]:
    """(found, parent) of ``version`` from the first location holding ``versions/<id>.json``."""
    for loc in locs:
        try:
            data = loc.read_bytes(version_path(version))
        except (FileNotFoundError, StorageError):
            continue
        try:
            parent = parse_header(data).get("parent")
        except ManifestError:
            continue
        return True, None if parent is None else str(parent)
    return False, None


def descends_from(locs: Sequence[Location], version: str, ancestor: str) -> tuple[bool, str]:
    """Whether ``version`` has ``ancestor`` on its ``parent`` chain (or is it).

    The chain is read from ``versions/<id>.json`` at ``locs``, first found wins. Returns
    (answer, why) — why names the break when the chain cannot be followed to an end."""
    seen: set[str] = set()
    v: str | None = version
    while v is not None and len(seen) < _MAX_CHAIN:
        if v == ancestor:
            return True, ""
        if v in seen:
            return False, f"the parent chain of {version} loops at {v}"
        seen.add(v)
        found, parent = _parent_of(locs, v)
        if not found:
            return False, f"versions/{v}.json is missing, so {version} cannot be shown to descend from {ancestor}"
        v = parent
    return False, f"{ancestor} is not an ancestor of {version}"
