"""Compare-and-swap of small objects (``manifest.json``, the writer lease), per backend.

``read_versioned`` returns an object's bytes with a *token* that names exactly those bytes;
``write_if`` replaces the object only if it still carries that token (``None``: only if it
does not exist), atomically, and raises :class:`WriteConflictError` otherwise — never
check-then-write. What makes it atomic depends on the store:

- **local filesystems** (``file://``, plain paths, NFS): a POSIX advisory lock
  (``fcntl.lockf``) on ``<dataset>/.ferry-lock``, held across the check and the
  ``os.replace``; the token is the xxh128 of the bytes. POSIX locks are honoured by every
  process on a host and, on NFS, across hosts (NFSv4, or NFSv3 with lockd); a filesystem
  that keeps locks local to one client (some FUSE mounts, Lustre ``localflock``) gives no
  cross-host guarantee. Threads of one process are serialised by an in-process lock too
  (POSIX locks belong to the process, not the thread).
- **S3** (s3fs): conditional PUTs, ``If-Match: <ETag>`` to replace and ``If-None-Match: *``
  to create; the token is the ETag, read in the same GET as the bytes. A store that
  ignores these headers (older S3-compatible servers) silently degrades to last writer
  wins: check yours (AWS S3 and moto enforce them).
- **Google Cloud Storage** (gcsfs): generation preconditions, ``ifGenerationMatch=<generation>``
  to replace and ``ifGenerationMatch=0`` to create, on a single-request multipart upload (the
  upload type both GCS and fake-gcs-server check the precondition on; fake-gcs-server ignores it
  on ``uploadType=media``); the token is the generation the download of the bytes returned
  (``x-goog-generation``).
- **Azure Blob Storage** (adlfs): ``If-Match: <ETag>`` to replace and ``If-None-Match: *`` to
  create, through azure-storage-blob's ``upload_blob``; the token is the ETag of the download
  that returned the bytes (Azurite enforces both).
- On all three, each write carries a unique id in the object's metadata (``ferry-write``): when a
  client library re-sends a write whose response was lost and the retry's precondition fails on
  the object the first attempt stored, that id says so and the write is reported done, not lost.
- **memory://**: one in-process lock (the store exists in this process only).
- **any other store**: no atomic primitive is known to ferry; the write is
  check-then-write (a race between two writers can lose one), said once per process in a
  warning. The documentation's Guarantees page (docs/guarantees.md) lists this.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import xxhash
from fsspec import AbstractFileSystem

from ..errors import StorageError, WriteConflictError
from .store import Location, atomic_local_write, storage_error

__all__ = ["LOCK_FILE", "Versioned", "read_versioned", "write_if", "cas_kind"]

LOCK_FILE = ".ferry-lock"
_LOCK_TIMEOUT = 60.0  # the lock is held for one small write; this long means a stuck holder
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()
_memory_lock = threading.Lock()
_warned: set[str] = set()


@dataclass(frozen=True)
class Versioned:
    """An object's bytes (None: absent) and the token that names exactly those bytes."""

    data: bytes | None
    token: str | None


def _unwrapped(loc: Location) -> Location:
    """``loc`` on the filesystem that really stores its bytes: a wrapping filesystem that delegates
    to another under the same paths (``.inner``, as fault injection does) is looked through."""
    fs = loc.fs
    for _ in range(8):
        inner = getattr(fs, "inner", None)
        if not isinstance(inner, AbstractFileSystem):
            break
        fs = inner
    return loc if fs is loc.fs else Location(fs, loc.root, loc.url)


#: fsspec implementation (a class in the filesystem's MRO) → the conditional-write API ferry uses
_CONDITIONAL = {"S3FileSystem": "s3", "GCSFileSystem": "gcs", "AzureBlobFileSystem": "azure"}


def _store(loc: Location) -> str | None:
    """``s3``, ``gcs`` or ``azure`` where ``loc``'s filesystem has conditional writes, else None."""
    for cls in type(loc.fs).__mro__:
        if cls.__name__ in _CONDITIONAL:
            return _CONDITIONAL[cls.__name__]
    return None


def cas_kind(loc: Location) -> str:
    """How ``loc`` swaps atomically: ``lock`` (local), ``conditional`` (S3, GCS, Azure Blob),
    ``memory`` or ``none``."""
    loc = _unwrapped(loc)
    if loc.local:
        return "lock"
    protocols = loc.fs.protocol if isinstance(loc.fs.protocol, tuple) else (loc.fs.protocol,)
    if "memory" in protocols:
        return "memory"
    if _store(loc) is not None:
        return "conditional"
    return "none"


def _digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def read_versioned(loc: Location, rel: str) -> Versioned:
    """The object at ``rel`` with its token (``Versioned(None, None)`` where it does not exist)."""
    loc = _unwrapped(loc)
    store = _store(loc) if cas_kind(loc) == "conditional" else None
    if store is not None:
        return _GET[store](loc, rel)
    try:
        data = loc.read_bytes(rel)
    except FileNotFoundError:
        return Versioned(None, None)
    return Versioned(data, _digest(data))


def write_if(loc: Location, rel: str, data: bytes, token: str | None) -> str:
    """Write ``data`` at ``rel`` only if the object still has ``token`` (None: is absent);
    returns the new token.

    Raises WriteConflictError (nothing written) when another writer changed it first."""
    loc = _unwrapped(loc)
    kind = cas_kind(loc)
    store = _store(loc) if kind == "conditional" else None
    if store is not None:
        return _PUT_IF[store](loc, rel, data, token, uuid.uuid4().hex)
    if kind == "lock":
        with _local_lock(loc):
            return _check_then_write(loc, rel, data, token)
    if kind == "memory":
        with _memory_lock:
            return _check_then_write(loc, rel, data, token)
    protocol = str(loc.fs.protocol)
    if protocol not in _warned:
        _warned.add(protocol)
        warnings.warn(
            f"{loc.url}: this store offers ferry no atomic compare-and-swap; concurrent writers "
            "of one dataset can lose a version here (see docs/guarantees.md)",
            RuntimeWarning,
            stacklevel=2,
        )
    return _check_then_write(loc, rel, data, token)


def _check_then_write(loc: Location, rel: str, data: bytes, token: str | None) -> str:
    try:
        now = loc.read_bytes(rel)
    except FileNotFoundError:
        now = None
    if (None if now is None else _digest(now)) != token:
        raise WriteConflictError(f"{loc.url}/{rel} was changed by another writer")
    if loc.local:
        try:
            atomic_local_write(loc.full(rel), data, sync_dir=True)
        except OSError as exc:
            raise storage_error(f"cannot write {loc.url}/{rel}: {exc}", exc) from exc
    else:
        loc.write_bytes(rel, data)
    return _digest(data)


@contextlib.contextmanager
def _local_lock(loc: Location) -> Iterator[None]:
    """Hold ``<root>/.ferry-lock`` exclusively: in this process (threads) and across processes."""
    path = loc.full(LOCK_FILE)
    with _thread_locks_guard:
        tlock = _thread_locks.setdefault(path, threading.Lock())
    import fcntl

    with tlock:
        try:
            os.makedirs(loc.root, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise storage_error(f"cannot open the lock {path}: {exc}", exc) from exc
        try:
            deadline = time.monotonic() + _LOCK_TIMEOUT
            pause = 0.002
            while True:
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise StorageError(f"cannot lock {path}: {exc}", retryable=False) from exc
                    if time.monotonic() > deadline:
                        raise StorageError(
                            f"{path} stayed locked for {_LOCK_TIMEOUT:.0f} s; is a writer stuck?"
                        ) from exc
                    time.sleep(pause)
                    pause = min(pause * 2, 0.05)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def _s3_split(loc: Location, rel: str) -> tuple[str, str]:
    bucket, key, _ = loc.fs.split_path(loc.full(rel))
    return bucket, key


def _s3_code(exc: BaseException) -> str:
    """The S3 error code behind an s3fs-translated exception ('' if none)."""
    for e in (exc, exc.__cause__, exc.__context__):
        response: Any = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            return str(code or status or "")
    return ""


def _s3_get(loc: Location, rel: str) -> Versioned:
    from fsspec.asyn import sync

    fs: Any = loc.fs
    bucket, key = _s3_split(loc, rel)

    async def get() -> tuple[bytes, str]:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key)
        body = resp["Body"]
        try:
            data = await body.read()
        finally:
            body.close()
        return bytes(data), str(resp["ETag"])

    try:
        data, etag = sync(fs.loop, get)
    except FileNotFoundError:
        return Versioned(None, None)
    except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
        raise storage_error(f"cannot read {loc.url}/{rel}: {exc}", exc) from exc
    return Versioned(data, etag)


def _s3_put_if(loc: Location, rel: str, data: bytes, token: str | None, write_id: str) -> str:
    fs: Any = loc.fs
    bucket, key = _s3_split(loc, rel)
    condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
    try:
        resp = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, Metadata={WRITE_ID: write_id}, **condition)
    except Exception as exc:  # noqa: BLE001
        code = _s3_code(exc)
        if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409") or isinstance(
            exc, FileExistsError
        ):
            mine = _own_write(lambda: _s3_head(fs, bucket, key), write_id)
            if mine is not None:
                return mine
            raise WriteConflictError(f"{loc.url}/{rel} was changed by another writer") from exc
        if code in ("NoSuchKey", "404") and token is not None:
            raise WriteConflictError(f"{loc.url}/{rel} was removed by another writer") from exc
        raise storage_error(f"cannot write {loc.url}/{rel}: {exc}", exc) from exc
    finally:
        fs.invalidate_cache(loc.full(rel))
    return str(resp["ETag"])


#: user metadata naming the write that stored an object (Azure metadata names are identifiers)
WRITE_ID = "ferry-write"
WRITE_ID_AZURE = "ferry_write"


def _own_write(head: Any, write_id: str) -> str | None:
    """The token of the object if this very write stored it, else None.

    A client library retries a request whose response was lost (a dropped connection, a timeout);
    when the first attempt was stored, the retry's precondition fails on the object it wrote itself.
    Each conditional write carries a unique id in the object's metadata: finding it there means the
    write did happen. ``head()`` returns (metadata, token) of the current object, or None."""
    try:
        found = head()
    except Exception:  # noqa: BLE001 - cannot tell: the precondition failure stands
        return None
    if found is None:
        return None
    metadata, token = found
    return str(token) if metadata.get(WRITE_ID, metadata.get(WRITE_ID_AZURE)) == write_id else None


def _s3_head(fs: Any, bucket: str, key: str) -> tuple[dict[str, str], str]:
    resp = fs.call_s3("head_object", Bucket=bucket, Key=key)
    return dict(resp.get("Metadata") or {}), str(resp["ETag"])


def _gcs_head(fs: Any, bucket: str, key: str) -> tuple[dict[str, str], str]:
    from fsspec.asyn import sync

    out = sync(fs.loop, fs._call, "GET", "b/{}/o/{}", bucket, key, json_out=True)
    return dict(out.get("metadata") or {}), str(out["generation"])


def _azure_head(fs: Any, container: str, blob: str) -> tuple[dict[str, str], str]:
    from fsspec.asyn import sync

    async def head() -> tuple[dict[str, str], str]:
        async with fs.service_client.get_blob_client(container, blob) as client:
            props = await client.get_blob_properties()
            return dict(props.metadata or {}), str(props.etag)

    return sync(fs.loop, head)


def _conflict(loc: Location, rel: str, exc: BaseException) -> WriteConflictError:
    return WriteConflictError(f"{loc.url}/{rel} was changed by another writer (its precondition failed: {exc})")


def _gcs_get(loc: Location, rel: str) -> Versioned:
    """One GET of the object's bytes; its ``x-goog-generation`` header names exactly those bytes."""
    from fsspec.asyn import sync

    fs: Any = loc.fs
    path = loc.full(rel)

    async def get() -> tuple[bytes, str]:
        headers, data = await fs._call("GET", fs.url(path))
        generation = headers.get("x-goog-generation")
        if not generation:
            raise StorageError(f"{loc.url}/{rel}: the store sent no x-goog-generation with the object")
        return bytes(data), str(generation)

    try:
        data, generation = sync(fs.loop, get)
    except FileNotFoundError:
        return Versioned(None, None)
    except StorageError:
        raise
    except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
        raise storage_error(f"cannot read {loc.url}/{rel}: {exc}", exc) from exc
    return Versioned(data, generation)


def _gcs_multipart(name: str, data: bytes, write_id: str) -> tuple[bytes, str]:
    """A ``multipart/related`` upload body (object metadata, then the bytes) and its content type."""
    for _ in range(8):  # a random 128-bit boundary: in practice the first draw is not in the data
        boundary = f"ferry-{uuid.uuid4().hex}"
        if boundary.encode() not in data:
            break
    else:
        raise StorageError("cannot find a multipart boundary absent from the data")
    metadata = json.dumps({"name": name, "metadata": {WRITE_ID: write_id}})
    head = (
        f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n"
        f"--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n"
    )
    body = head.encode() + data + f"\r\n--{boundary}--\r\n".encode()
    return body, f'multipart/related; boundary="{boundary}"'


def _gcs_put_if(loc: Location, rel: str, data: bytes, token: str | None, write_id: str) -> str:
    """A single-request multipart upload with ``ifGenerationMatch`` (0: only if absent)."""
    from urllib.parse import quote

    from fsspec.asyn import sync

    fs: Any = loc.fs
    path = loc.full(rel)
    bucket, key, _ = fs.split_path(path)
    body, content_type = _gcs_multipart(key, data, write_id)

    async def put() -> dict[str, Any]:
        return await fs._call(
            "POST", f"{fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
            uploadType="multipart", ifGenerationMatch=token or "0",
            headers={"Content-Type": content_type}, data=body, json_out=True,
        )  # fmt: skip

    try:
        out = sync(fs.loop, put)
    except FileExistsError as exc:  # gcsfs's mapping of 412 Precondition Failed
        mine = _own_write(lambda: _gcs_head(fs, bucket, key), write_id)
        if mine is not None:
            return mine
        raise _conflict(loc, rel, exc) from exc
    except Exception as exc:  # noqa: BLE001
        raise storage_error(f"cannot write {loc.url}/{rel}: {exc}", exc) from exc
    finally:
        fs.invalidate_cache(path)
    return str(out["generation"])


def _azure_get(loc: Location, rel: str) -> Versioned:
    """Download the blob; the ETag of that download names exactly its bytes (later ranges of a
    large blob are read ``If-Match`` that ETag by azure-storage-blob)."""
    from azure.core.exceptions import ResourceNotFoundError
    from fsspec.asyn import sync

    fs: Any = loc.fs
    container, blob, _ = fs.split_path(loc.full(rel))

    async def get() -> tuple[bytes, str]:
        async with fs.service_client.get_blob_client(container, blob) as client:
            stream = await client.download_blob()
            return bytes(await stream.readall()), str(stream.properties.etag)

    try:
        data, etag = sync(fs.loop, get)
    except ResourceNotFoundError as exc:
        if getattr(exc, "error_code", None) == "ContainerNotFound":
            raise storage_error(f"cannot read {loc.url}/{rel}: no container {container!r}", exc) from exc
        return Versioned(None, None)
    except Exception as exc:  # noqa: BLE001
        raise storage_error(f"cannot read {loc.url}/{rel}: {exc}", exc) from exc
    return Versioned(data, etag)


def _azure_put_if(loc: Location, rel: str, data: bytes, token: str | None, write_id: str) -> str:
    """``upload_blob`` with ``If-None-Match: *`` (create) or ``If-Match: <ETag>`` (replace)."""
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError
    from fsspec.asyn import sync

    fs: Any = loc.fs
    path = loc.full(rel)
    container, blob, _ = fs.split_path(path)
    condition: dict[str, Any] = (
        {"overwrite": False}
        if token is None
        else {"overwrite": True, "etag": token, "match_condition": MatchConditions.IfNotModified}
    )

    async def put() -> dict[str, Any]:
        async with fs.service_client.get_blob_client(container, blob) as client:
            return await client.upload_blob(data, metadata={WRITE_ID_AZURE: write_id}, **condition)

    try:
        out = sync(fs.loop, put)
    except HttpResponseError as exc:
        code = getattr(exc, "error_code", None)
        if exc.status_code == 412 or code in ("BlobAlreadyExists", "ConditionNotMet"):
            mine = _own_write(lambda: _azure_head(fs, container, blob), write_id)
            if mine is not None:
                return mine
            raise _conflict(loc, rel, exc) from exc
        if code == "BlobNotFound" and token is not None:
            raise WriteConflictError(f"{loc.url}/{rel} was removed by another writer") from exc
        raise storage_error(f"cannot write {loc.url}/{rel}: {exc}", exc) from exc
    except Exception as exc:  # noqa: BLE001
        raise storage_error(f"cannot write {loc.url}/{rel}: {exc}", exc) from exc
    finally:
        fs.invalidate_cache(path)
    return str(out["etag"])


_GET = {"s3": _s3_get, "gcs": _gcs_get, "azure": _azure_get}
_PUT_IF = {"s3": _s3_put_if, "gcs": _gcs_put_if, "azure": _azure_put_if}
