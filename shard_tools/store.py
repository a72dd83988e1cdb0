"""Storage access over fsspec: resolve URLs, read and write whole objects atomically.

Every write goes to its final name in one atomic step: on a local filesystem a temp
file in the same directory is fsync'ed and renamed over the target; on object stores
(s3, gs, memory) a single PUT (or a completed multipart upload) is atomic by itself.
Temp files carry ``TEMP_MARKER`` in their name so a planner can find stale ones.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import socket
import uuid
from collections.abc import Mapping
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from .errors import StorageError

__all__ = [
    "Location",
    "TEMP_MARKER",
    "resolve",
    "with_store_defaults",
    "is_local",
    "temp_name",
    "temp_writer",
    "temp_is_stale",
    "atomic_local_write",
    "STALE_TEMP_SECONDS",
    "process_alive",
    "not_permitted",
    "storage_error",
]

TEMP_MARKER = ".ferry-tmp-"
#: A temp file whose writer cannot be checked (another host) is stale only after this long
#: without a change: a writer streaming into it touches it far more often.
STALE_TEMP_SECONDS = 15 * 60
_HOST = hashlib.blake2s(socket.gethostname().encode(), digest_size=4).hexdigest()


# Refusals no retry can fix: permission denied, operation not permitted, read-only filesystem.
_NOT_PERMITTED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_DENIED_CODES = frozenset({"AccessDenied", "AllAccessDisabled", "Forbidden", "403"})


def _http_forbidden(e: BaseException) -> bool:
    """An HTTP 403 as gcsfs raises it (``OSError("Forbidden: …")``, no errno; or its ``HttpError``
    with ``code`` 403) or as azure-core does (``HttpResponseError.status_code`` 403)."""
    if isinstance(e, OSError) and e.errno is None and str(e).startswith("Forbidden: "):
        return True
    module = type(e).__module__
    if module.startswith("gcsfs") and getattr(e, "code", None) == 403:
        return True
    return module.startswith("azure") and getattr(e, "status_code", None) == 403


def not_permitted(exc: BaseException) -> bool:
    """Whether ``exc`` or what caused it is a refusal no retry can fix: EACCES, EPERM or EROFS, a
    PermissionError (s3fs's mapping of AccessDenied and other 403s), an S3 AccessDenied / HTTP 403,
    or a 403 from GCS (gcsfs) or Azure Blob (azure-storage-blob, under adlfs)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, PermissionError) or (isinstance(e, OSError) and e.errno in _NOT_PERMITTED):
            return True
        if _http_forbidden(e):
            return True
        response = getattr(e, "response", None)  # botocore's ClientError
        if isinstance(response, dict):
            code = (response.get("Error") or {}).get("Code")
            status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
            if code in _DENIED_CODES or status == 403:
                return True
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return False


def storage_error(message: str, exc: BaseException) -> StorageError:
    """The StorageError for a backend failure ``exc``: fatal (not retried) when access is refused."""
    if not_permitted(exc):
        return StorageError(
            f"{message} (access refused or read-only storage: not retried; fix the permissions, then retry)",
            retryable=False,
        )
    if isinstance(exc, FileNotFoundError) and exc.errno is None:  # gcsfs's 404: its message is only the URL
        return StorageError(f"{message} (not found: does the bucket exist?)")
    return StorageError(message)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """True for filesystems where rename is atomic and files can be memory-mapped."""
    return isinstance(fs, LocalFileSystem)


def temp_name(path: str) -> str:
    """A unique temp path beside ``path`` (same directory, so a rename is atomic).

    The name carries its writer (a hash of the host name and the process id), so a
    cleaner never deletes a temp file that a live writer on this host is still filling."""
    head, tail = posixpath.split(path)
    return posixpath.join(head, f"{TEMP_MARKER}{_HOST}.{os.getpid()}.{uuid.uuid4().hex[:12]}-{tail}")


def temp_writer(name: str) -> tuple[str, int] | None:
    """(host hash, pid) of the process that made temp file ``name``; None for older names."""
    base = posixpath.basename(name)
    if not base.startswith(TEMP_MARKER):
        return None
    parts = base[len(TEMP_MARKER) :].split("-", 1)[0].split(".")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def temp_is_stale(name: str, age_seconds: float | None) -> bool:
    """Whether temp file ``name`` may be deleted: its writer on this host is gone, or (writer
    elsewhere or unknown) it has not changed for ``STALE_TEMP_SECONDS``."""
    writer = temp_writer(name)
    if writer is not None and writer[0] == _HOST:
        return writer[1] != os.getpid() and not process_alive(writer[1])
    return age_seconds is None or age_seconds >= STALE_TEMP_SECONDS


class Location:
    """A dataset root: an fsspec filesystem plus a path prefix.

    All paths given to its methods are relative to the root and use ``/``.
    """

    def __init__(self, fs: fsspec.AbstractFileSystem, root: str, url: str) -> None:
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url

    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    @property
    def local(self) -> bool:
        return is_local(self.fs)

    def full(self, rel: str) -> str:
        return f"{self.root}/{rel}" if rel else self.root

    def exists(self, rel: str) -> bool:
        try:
            return bool(self.fs.exists(self.full(rel)))
        except Exception as exc:  # noqa: BLE001 - any backend failure is a storage error
            raise storage_error(f"cannot check {self.url}/{rel}: {exc}", exc) from exc

    def read_bytes(self, rel: str) -> bytes:
        """Read a whole object; ``FileNotFoundError`` passes through for callers to map."""
        try:
            return bytes(self.fs.cat_file(self.full(rel)))
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise storage_error(f"cannot read {self.url}/{rel}: {exc}", exc) from exc

    def size(self, rel: str) -> int:
        try:
            return int(self.fs.size(self.full(rel)))
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot stat {self.url}/{rel}: {exc}") from exc

    def write_bytes(self, rel: str, data: bytes | memoryview | tuple[bytes, ...]) -> None:
        """Write ``data`` to ``rel`` atomically (readers see the old object or the whole new one); a
        tuple of pieces is written as their concatenation (a local file piece by piece, unjoined)."""
        path = self.full(rel)
        try:
            if self.local:
                atomic_local_write(path, data)
            else:
                self.fs.pipe_file(path, b"".join(data) if isinstance(data, tuple) else bytes(data))
        except Exception as exc:  # noqa: BLE001
            raise storage_error(f"cannot write {self.url}/{rel}: {exc}", exc) from exc

    def listdir(self, rel: str) -> list[str]:
        """Names (not paths) of the entries directly under ``rel``; empty if it does not exist."""
        path = self.full(rel)
        try:
            entries = self.fs.ls(path, detail=False)
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise StorageError(f"cannot list {self.url}/{rel}: {exc}") from exc
        return sorted(posixpath.basename(str(e).rstrip("/")) for e in entries)

    def remove(self, rel: str) -> None:
        try:
            self.fs.rm_file(self.full(rel))
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001
            raise storage_error(f"cannot delete {self.url}/{rel}: {exc}", exc) from exc


def atomic_local_write(path: str, data: bytes | memoryview | tuple[bytes, ...], *, sync_dir: bool = False) -> None:
    """Temp file beside ``path`` (a tuple of pieces written in order), fsync'ed, renamed over it;
    ``sync_dir`` also makes the rename itself durable (for the objects whose name is the commit:
    manifest.json, the lease)."""
    parent = os.path.dirname(path) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            for piece in data if isinstance(data, tuple) else (data,):
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if sync_dir:
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


_S3_PROTOCOLS = ("s3://", "s3a://")


def with_store_defaults(url: str, storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """``storage_options`` plus ferry's defaults for the URL's store; the caller's values win.

    S3: request bodies are sent unsigned (``UNSIGNED-PAYLOAD``, as rclone and the AWS SDKs
    do over TLS) instead of SHA-256-signed — ferry hashes every byte it uploads itself
    (xxh128, checked against the manifest before an upload completes) and TLS protects the
    bytes in transit, so signing the body costs a second pass over it on both ends for
    nothing. Set ``config_kwargs.s3.payload_signing_enabled=true`` to sign anyway (e.g.
    over a plain-HTTP endpoint that is not on loopback).
    """
    options = dict(storage_options or {})
    if url.startswith(_S3_PROTOCOLS):
        config = dict(options.get("config_kwargs") or {})
        s3 = dict(config.get("s3") or {})
        s3.setdefault("payload_signing_enabled", False)
        config["s3"] = s3
        options["config_kwargs"] = config
    return options


def resolve(url: str, storage_options: Mapping[str, Any] | None = None) -> Location:
    """Turn a URL (or plain path) into a :class:`Location`.

    Storage options come from the caller; credentials otherwise come from the
    backend's usual environment variables and profiles.
    """
    try:
        fs, root = fsspec.core.url_to_fs(url, **with_store_defaults(url, storage_options))
    except (ImportError, ValueError) as exc:
        raise StorageError(f"cannot open {url!r}: {exc}", retryable=False) from exc
    if url.startswith(_S3_PROTOCOLS):
        _share_s3_session(fs)
    if is_local(fs):
        root = os.path.abspath(root)
    return Location(fs, root, url.rstrip("/"))


_S3_SESSION: list[Any] = []  # this process's botocore session; a forked DataLoader worker inherits it, warm


def _share_s3_session(fs: Any) -> None:
    """Give a new S3 filesystem this process's botocore session.

    A new session parses botocore's service models again: ~0.1 s before the first request of every
    dataset opened, and of every DataLoader worker. With a shared one a client is made in ~10 ms. Not
    where the caller chose a session or a profile (``fs.kwargs``), nor once the filesystem has a client.
    The session is set on the filesystem, not in its storage options, which stay picklable."""
    if getattr(fs, "session", True) is not None or getattr(fs, "_s3", None) is not None or getattr(fs, "kwargs", None):
        return
    if not _S3_SESSION:  # two threads may both make one: harmless, the first stays
        import aiobotocore.session

        _S3_SESSION.append(aiobotocore.session.AioSession())
    fs.session = _S3_SESSION[0]
    fs._session_is_owned = False  # s3fs's flag for a caller's session: a refresh keeps it
