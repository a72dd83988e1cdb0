"""The no-op check of ``ferry sync`` without the storage stack: two manifest reads, little imported.

A no-op resync compares the version ids in the source's and the destination's ``manifest.json``.
Through fsspec an S3 side costs importing s3fs, aiobotocore, botocore and aiohttp and building an
S3 client, several times the check itself. For local paths and for S3 URLs with plain settings,
this module reads each ``manifest.json`` directly (``s3_get``: one SigV4-signed GET over
``http.client``).

It only ever answers "up to date": another version, a missing or unreadable manifest, an HTTP
error or any setting it does not handle gives None, and ``ferry sync`` takes its full path,
which decides everything itself. So this module can make a no-op faster, never a sync different.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ferry.shard_tools.errors import FerryError
from ferry.shard_tools.format.header import MANIFEST_FILE, parse_header
from ferry.shard_tools.storage.s3_get import fetch, plan_s3_get

__all__ = ["up_to_date_header", "read_manifest"]

_MAX_HEADER = 64 * 2**20  # a manifest.json header is a few KiB; anything huge is not one


def up_to_date_header(
    src_url: str, dst_url: str, src_options: Mapping[str, Any], dst_options: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The source's parsed header when the destination already publishes the same version, else None."""
    try:
        src = read_manifest(src_url, src_options)
        dst = read_manifest(dst_url, dst_options) if src is not None else None
        if src is None or dst is None:
            return None
        src_doc, dst_doc = parse_header(src), parse_header(dst)
    except (FerryError, TypeError, KeyError, AttributeError):  # odd options or documents: the full path says why
        return None
    return src_doc if src_doc["version_id"] == dst_doc["version_id"] else None


def read_manifest(url: str, options: Mapping[str, Any]) -> bytes | None:
    """The first bytes of ``url``/manifest.json (local or plain S3), or None: missing, unreadable, not handled."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    try:
        if scheme in ("", "file", "local"):  # fsspec's local filesystem has no option that changes a read
            path = Path(url.split("://", 1)[1] if scheme else url) / MANIFEST_FILE
            with open(path, "rb") as f:
                return f.read(_MAX_HEADER + 1)
        if scheme in ("s3", "s3a"):
            get = plan_s3_get(url.rstrip("/") + "/" + MANIFEST_FILE, options, os.environ)
            return None if get is None else fetch(get, _MAX_HEADER)
    except (OSError, http.client.HTTPException, ValueError):
        return None
    return None
