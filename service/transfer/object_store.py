"""What the copy paths need to know about object stores: which buffer writes, part sizes, unfinished
uploads, how a store says a create-only write found the name taken, and botocore's checksum default.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ferry.shard_tools.errors import StorageError
from ferry.shard_tools.storage.store import STALE_TEMP_SECONDS, Location

__all__ = [
    "SINGLE_PUT_MAX",
    "writes_buffered",
    "part_size",
    "abort_stale_uploads",
    "skip_double_checksums",
    "create_refused",
]

MIN_PART = 5 * 1024 * 1024  # S3's smallest multipart part
# A shard up to this size goes to an object store as one PUT (one request instead of
# create + parts + complete); larger ones upload in parts of this size. It bounds the
# upload buffer per transfer.
SINGLE_PUT_MAX = 64 * 1024 * 1024
_BUFFERED_PROTOCOLS = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "oci", "oss")
_BUFFERED: dict[type, bool] = {}


def skip_double_checksums() -> None:
    """Ask botocore for its own CRC32 of every body only where S3 requires it.

    Every byte ferry moves is hashed (xxh128) and checked against the manifest, so botocore's
    checksum (default "when_supported" since botocore 1.36) is CPU spent twice. A user's
    environment still wins. Called by the daemon and ``ferry sync`` before they open any store.
    """
    os.environ.setdefault("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    os.environ.setdefault("AWS_RESPONSE_CHECKSUM_VALIDATION", "when_required")


def writes_buffered(dst: Location) -> bool:
    """True for filesystems whose write files are AbstractBufferedFile (s3, gcs, azure…)."""
    cls = type(dst.fs)
    if cls not in _BUFFERED:
        from fsspec.implementations.memory import MemoryFileSystem

        _BUFFERED[cls] = not isinstance(dst.fs, MemoryFileSystem) and _open_returns_buffered(dst)
    return _BUFFERED[cls]


def _open_returns_buffered(dst: Location) -> bool:
    name = getattr(dst.fs, "protocol", "")
    protos = (name,) if isinstance(name, str) else tuple(name)
    return any(p in _BUFFERED_PROTOCOLS for p in protos) or getattr(dst.fs, "buffered_writes", False)


_TAKEN_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict", "BlobAlreadyExists", "ConditionNotMet"})


def create_refused(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a store refusing a create-only write because an object has
    the name: FileExistsError (s3fs, gcsfs and adlfs map it so), an S3 412 PreconditionFailed or 409
    ConditionalRequestConflict (another create of the name runs), an Azure 412 or BlobAlreadyExists."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, FileExistsError):
            return True
        response = getattr(e, "response", None)  # botocore's ClientError
        if isinstance(response, dict):
            code = str((response.get("Error") or {}).get("Code") or "")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in _TAKEN_CODES or status == 412:
                return True
        if type(e).__module__.startswith("azure") and (
            getattr(e, "status_code", None) == 412 or getattr(e, "error_code", None) in _TAKEN_CODES
        ):
            return True
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return False


def part_size(size: int, chunk: int) -> int:
    """Upload buffer size: above ``size`` (so the store gets one PUT) up to SINGLE_PUT_MAX."""
    if size < SINGLE_PUT_MAX:
        return max(size + 1, chunk, MIN_PART)
    return max(SINGLE_PUT_MAX, chunk)


def abort_stale_uploads(loc: Location) -> int:
    """Abort unfinished multipart uploads under ``loc`` (left by a killed writer); returns how many.

    They are invisible to readers but hold storage. Only S3-like stores have them; elsewhere 0.
    Only uploads started more than ``STALE_TEMP_SECONDS`` ago count as left behind: a younger
    one may belong to a live writer on another host (a ``ferry pack --append`` into the same
    dataset copy does not hold the writer lease).
    """
    call = getattr(loc.fs, "call_s3", None)
    if call is None:
        return 0
    bucket, _, key = loc.root.partition("/")
    try:
        listed = call("list_multipart_uploads", Bucket=bucket, Prefix=f"{key}/" if key else "").get("Uploads", [])
        cutoff = time.time() - STALE_TEMP_SECONDS
        uploads = [up for up in listed if _started(up) < cutoff]
        for up in uploads:
            call("abort_multipart_upload", Bucket=bucket, Key=up["Key"], UploadId=up["UploadId"])
    except Exception as exc:  # noqa: BLE001
        raise StorageError(f"cannot clean unfinished uploads at {loc.url}: {exc}") from exc
    return len(uploads)


def _started(upload: dict[str, Any]) -> float:
    """When a listed multipart upload began (0: unknown, so it counts as old)."""
    initiated = upload.get("Initiated")
    return float(initiated.timestamp()) if initiated is not None and hasattr(initiated, "timestamp") else 0.0
