"""Publishing a version: shard table, then ``versions/<id>.json``, then ``manifest.json`` last.

Shards must already be stored. A reader that sees the new ``manifest.json`` therefore
finds every shard it names; a crash before the last write leaves the old version current.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import DatasetNotFoundError, PublishError
from .header import MANIFEST_FILE, version_path
from .manifest import Manifest
from .store import Location

__all__ = ["publish_version", "current_version_id"]


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


def publish_version(
    loc: Location,
    manifest: Manifest,
    table_data: bytes,
    *,
    expect_current: str | None,
    new_shards: Sequence[str] = (),
) -> None:
    """Make ``manifest`` the current version at ``loc``.

    ``expect_current`` is the version the new one was built on (None for a new dataset); if
    ``manifest.json`` names another version by now, nothing is published and PublishError is
    raised, so two writers never silently drop each other's shards. ``new_shards`` are
    checked to exist first (old ones were checked when their version was published).
    """
    _check_stored(loc, new_shards)
    if not loc.exists(manifest.table_path):
        loc.write_bytes(manifest.table_path, table_data)
    body = manifest.to_json()
    loc.write_bytes(version_path(manifest.version_id), body)
    try:
        now = current_version_id(loc)
    except DatasetNotFoundError:
        now = None
    if now != expect_current:
        raise PublishError(
            f"{loc.url} changed while packing (current version {now}, expected {expect_current}); "
            "nothing was published, run again"
        )
    loc.write_bytes(MANIFEST_FILE, body)
