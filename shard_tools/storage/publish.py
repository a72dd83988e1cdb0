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

from ..errors import ManifestError, PublishError, StorageError, WriteConflictError
from ..format.header import MANIFEST_FILE, parse_header, version_path
from ..format.manifest import Manifest, StoredShards, lineage_of
from .conditional import read_versioned, write_if
from .store import Location

__all__ = [
    "publish_version",
    "current_version_id",
    "swap_manifest",
    "store_version",
    "descends_from",
    "carry_lineage",
    "LINEAGE_DIR",
    "lineage_path",
]

#: ``lineage/<id>.json``: a copy of every version's header, kept when retention prunes ``versions/``
#: (retention never deletes it), so that ancestry stays answerable. About 1-2 KB per version.
LINEAGE_DIR = "lineage"

#: Conflicting writers each win one round, so this many rounds means something is wrong.
SWAP_ATTEMPTS = 64
_MAX_CHAIN = 1_000_000


def lineage_path(version_id: str) -> str:
    return f"{LINEAGE_DIR}/{version_id}.json"


def current_version_id(loc: Location) -> str | None:
    """The version id ``manifest.json`` names now, or None where there is none."""
    try:
        data = loc.read_bytes(MANIFEST_FILE)
    except FileNotFoundError:
        return None
    return str(Manifest.parse_header(data)["version_id"])


def _check_stored(loc: Location, paths: Sequence[str]) -> None:
    """Every path must exist: one HEAD each for a few, one listing per directory for many. Asked of the store,
    not of a listing this handle kept (the shards may have been stored through another handle)."""
    unique = sorted(set(paths))
    for head in sorted({p.rpartition("/")[0] for p in unique}):
        loc.fs.invalidate_cache(loc.full(head))
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


def store_version(
    loc: Location, manifest: Manifest | StoredShards, table_data: bytes, body: bytes | None = None
) -> bytes:
    """Store a version's shard table, ``lineage/<id>.json`` and ``versions/<id>.json`` (immutable,
    named by content); returns the manifest body: the header ``versions/<id>.json`` holds. Safe to repeat
    and to race: two writers of one version write headers that differ at most in ``created_at`` and
    ``tool_version``, and the first one stored stays (a published object is never rewritten)."""
    if not loc.exists(manifest.table_path):
        loc.write_bytes(manifest.table_path, table_data)
    body = manifest.to_json() if body is None else body
    _keep_first(loc, lineage_path(manifest.version_id), body, manifest.version_id)
    return _keep_first(loc, version_path(manifest.version_id), body, manifest.version_id)


def _keep_first(loc: Location, rel: str, body: bytes, version: str) -> bytes:
    """``body`` written at ``rel`` unless a header of ``version`` is there already (an earlier or racing
    writer's): then those bytes, untouched. Anything else there (damaged, another version's) is replaced."""
    for _ in range(SWAP_ATTEMPTS):
        current = read_versioned(loc, rel)
        if current.data is not None:
            try:
                if str(parse_header(current.data)["version_id"]) == version:
                    return current.data
            except (ManifestError, KeyError):
                pass
        try:
            write_if(loc, rel, body, current.token)
            return body
        except WriteConflictError:
            continue  # another writer stored it meanwhile: look at what it stored
    raise PublishError(f"{loc.url}/{rel} kept changing under {SWAP_ATTEMPTS} attempts")


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


def _record(locs: Sequence[Location], version: str, *, legacy: bool = False) -> dict[str, Any] | None:
    """The checked header of ``version``: ``lineage/<id>.json`` (never pruned), else ``versions/<id>.json``,
    at the first location holding a readable one; None where none does. ``legacy`` (a version below one
    written before lineages, so most likely without a record) tries ``versions/`` first."""
    paths = (lineage_path(version), version_path(version))
    for loc in locs:
        for path in reversed(paths) if legacy else paths:
            try:
                doc = parse_header(loc.read_bytes(path))
                if doc["version_id"] != version:
                    continue
                doc["lineage"] = lineage_of(doc)
                return doc
            except (FileNotFoundError, StorageError, ManifestError):
                continue
    return None


def _lift(locs: Sequence[Location], doc: dict[str, Any], gen: int) -> tuple[str | None, str]:
    """The ancestor at generation ``gen`` of the version ``doc`` (a header with a lineage, above ``gen``
    in the same chain): (id, "") or (None, why). Each step at least halves the distance, so at most one
    record is read per bit of it."""
    lin = doc["lineage"]
    for _ in range(128):
        step, target = min(((int(g), str(v)) for g, v in lin["up"] if g >= gen), key=lambda e: e[0])
        if step == gen:
            return target, ""
        nxt = _record(locs, target)
        if nxt is None:
            return None, f"{lineage_path(target)} is missing (an ancestor of {doc['version_id']})"
        nlin = nxt["lineage"]
        if nlin is None or nlin["gen"] != step or nlin["root"] != lin["root"]:
            return None, f"the lineage of {target} does not match {doc['version_id']}'s (hand-edited?)"
        lin = nlin
    return None, f"the lineage of {doc['version_id']} does not converge"  # pragma: no cover - bounded by gen bits


def descends_from(locs: Sequence[Location], version: str, ancestor: str) -> tuple[bool, str]:
    """Whether ``version`` has ``ancestor`` on its ``parent`` chain (or is it).

    Headers are read from ``lineage/<id>.json`` (kept when retention prunes ``versions/``), else
    ``versions/<id>.json``, at ``locs``, first found wins. Versions with a lineage are answered in
    O(log distance) reads: at most 2 + log2(generations between them) + 1 headers, each found at
    the first path tried where the lineage was written. Versions without one (written before
    lineages) are followed parent by parent as before. Returns (answer, why) — why names the
    break when the chain cannot be followed to an end."""
    seen: set[str] = set()
    anc: list[dict[str, Any] | None] = []  # the ancestor's header, read once when first needed
    v: str | None = version
    legacy = False
    while v is not None and len(seen) < _MAX_CHAIN:
        if v == ancestor:
            return True, ""
        if v in seen:
            return False, f"the parent chain of {version} loops at {v}"
        seen.add(v)
        doc = _record(locs, v, legacy=legacy)
        if doc is None:
            return False, f"versions/{v}.json is missing, so {version} cannot be shown to descend from {ancestor}"
        lin = doc["lineage"]
        legacy = lin is None
        if lin is None:
            v = None if doc["parent"] is None else str(doc["parent"])
            continue
        if lin["root"] == ancestor:
            return True, ""
        if not anc:
            anc.append(_record(locs, ancestor))
        alin = anc[0]["lineage"] if anc[0] is not None else None
        if alin is not None and alin["root"] == lin["root"]:
            if alin["gen"] >= lin["gen"]:
                return False, f"{ancestor} is not an ancestor of {version}"
            found, why = _lift(locs, doc, int(alin["gen"]))
            if found is None:
                return False, f"{why}, so {version} cannot be shown to descend from {ancestor}"
            return (True, "") if found == ancestor else (False, f"{ancestor} is not an ancestor of {version}")
        v = str(lin["root"])  # the ancestor is not in this chain of generations: go on below its root
    return False, f"{ancestor} is not an ancestor of {version}"


def carry_lineage(src: Sequence[Location], dst: Location, version: str, down_to: str | None) -> int:
    """Copy to ``dst`` the lineage records of ``version``'s ancestors newer than ``down_to`` (the version
    ``dst`` held before; None: none) that ``dst`` lacks, so that ``dst`` can answer ancestry alone when it
    is a source in turn, after its own retention or the source's. Returns how many were copied.

    Cost: per ancestor copied, one existence check at ``dst``, one read at ``src`` and one write; it stops
    at the first record ``dst`` already holds, at ``down_to``'s generation, or where ``src`` has none. So
    each version's record is copied to a destination once, over all the passes that bring it forward."""
    if down_to is None:
        return 0  # nothing older at dst to connect to: its checks only ever start from this version on
    known = _record([dst, *src], down_to)
    lin = known["lineage"] if known is not None else None
    floor = int(lin["gen"]) if lin is not None else 0
    doc = _record(src, version)
    copied = 0
    for _ in range(_MAX_CHAIN):
        if doc is None or doc["parent"] is None or doc["lineage"] is None or doc["lineage"]["gen"] - 1 <= floor:
            break
        parent = str(doc["parent"])
        if parent == down_to or dst.exists(lineage_path(parent)):
            break
        body = _raw_record(src, parent)
        if body is None:
            break
        dst.write_bytes(lineage_path(parent), body)
        copied += 1
        doc = parse_header(body)
        doc["lineage"] = lineage_of(doc)
    return copied


def _raw_record(locs: Sequence[Location], version: str) -> bytes | None:
    """The bytes of ``version``'s header (lineage/ or versions/) at the first location holding a valid one."""
    for loc in locs:
        for path in (lineage_path(version), version_path(version)):
            try:
                data = loc.read_bytes(path)
                doc = parse_header(data)
                if doc["version_id"] == version:
                    lineage_of(doc)
                    return data
            except (FileNotFoundError, StorageError, ManifestError):
                continue
    return None
