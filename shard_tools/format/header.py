"""The manifest's JSON header: dataset layout names, validation, and the version id.

Kept apart from :mod:`ferry.shard_tools.format.manifest` (which needs numpy and pyarrow for the shard
table) so that comparing two datasets' versions — all a no-op resync does — reads and
checks two small JSON documents and imports nothing heavy.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import ManifestError
from .digest import check_digest_string, digest_bytes

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_FILE",
    "VERSIONS_DIR",
    "TABLES_DIR",
    "SHARDS_DIR",
    "TOKEN_DTYPE_NAMES",
    "version_path",
    "version_id_of",
    "parse_header",
]

MANIFEST_FORMAT = 1
MANIFEST_FILE = "manifest.json"
VERSIONS_DIR = "versions"
TABLES_DIR = "tables"
SHARDS_DIR = "shards"
#: Token dtypes a shard may hold (shard_tools.format.shard maps them to Arrow types).
TOKEN_DTYPE_NAMES = ("uint16", "uint32")
_UNDIGESTED = ("version_id", "created_at", "tool_version")


def version_path(version_id: str) -> str:
    return f"{VERSIONS_DIR}/{version_id}.json"


def version_id_of(body: dict[str, Any]) -> str:
    """The version id of a header body: the digest of its canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return digest_bytes(canonical).split(":", 1)[1]


def parse_header(data: bytes) -> dict[str, Any]:
    """Parse and check a manifest's JSON header (no shard table); returns the validated dict."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"manifest is not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ManifestError("manifest is not a JSON object")
    _check_header(doc)
    body = {k: v for k, v in doc.items() if k not in _UNDIGESTED}
    if version_id_of(body) != doc["version_id"]:
        raise ManifestError(
            f"manifest body does not match its version id {doc['version_id']} "
            "(hand-edited or corrupt); restore it from versions/ or re-pack"
        )
    return doc


def _require(doc: dict[str, Any], key: str, types: type | tuple[type, ...], where: str = "manifest") -> Any:
    if key not in doc:
        raise ManifestError(f"{where} lacks {key!r}")
    value = doc[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in _as_tuple(types)):
        raise ManifestError(f"{where} field {key!r} has the wrong type ({type(value).__name__})")
    return value


def _as_tuple(types: type | tuple[type, ...]) -> Sequence[type]:
    return types if isinstance(types, tuple) else (types,)


def _check_header(doc: dict[str, Any]) -> None:
    if _require(doc, "format", int) != MANIFEST_FORMAT:
        raise ManifestError(f"manifest format {doc['format']} is not supported (expected {MANIFEST_FORMAT})")
    for key in ("version_id", "name", "token_dtype", "created_at", "tool_version"):
        _require(doc, key, str)
    if doc["token_dtype"] not in TOKEN_DTYPE_NAMES:
        raise ManifestError(f"unknown token dtype {doc['token_dtype']!r} (expected one of {list(TOKEN_DTYPE_NAMES)})")
    _require(doc, "eos_appended", bool)
    tok = _require(doc, "tokenizer", dict)
    _require(tok, "name", str, "tokenizer")
    _require(tok, "vocab_size", int, "tokenizer")
    if tok.get("eos_id") is not None:
        _require(tok, "eos_id", int, "tokenizer")
    else:
        tok["eos_id"] = None
    totals = _require(doc, "totals", dict)
    for key in ("shards", "documents", "tokens", "stored_bytes", "raw_bytes"):
        _require(totals, key, int, "totals")
    st = _require(doc, "shard_table", dict)
    _require(st, "path", str, "shard_table")
    _require(st, "bytes", int, "shard_table")
    check_digest_string(_require(st, "digest", str, "shard_table"))
    if not st["path"].startswith(f"{TABLES_DIR}/") or ".." in st["path"]:
        raise ManifestError(f"shard table path {st['path']!r} is not under {TABLES_DIR}/")
    if "parent" not in doc or not (doc["parent"] is None or isinstance(doc["parent"], str)):
        raise ManifestError("manifest field 'parent' must be a version id or null")
