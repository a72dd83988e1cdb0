"""Storage access over fsspec: resolve URLs, read and write whole objects atomically.

Every write goes to its final name in one atomic step: on a local filesystem a temp
file in the same directory is fsync'ed and renamed over the target (or, to create only,
hard-linked to it: ``link_new``); on object stores (s3, gs, memory) a single PUT (or a
completed multipart upload) is atomic by itself.
Temp files carry ``TEMP_MARKER`` in their name so a planner can find stale ones.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import re
import socket
import sys
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import fsspec
from fsspec.implementations.local import LocalFileSystem

from ..errors import StorageError

__all__ = [
    "Location",
    "TEMP_MARKER",
    "resolve",
    "with_store_defaults",
    "is_local",
    "temp_name",
    "temp_writer",
    "TempWriter",
    "WriterId",
    "Liveness",
    "this_writer",
    "writer_liveness",
    "temp_is_stale",
    "atomic_local_write",
    "link_new",
    "STALE_TEMP_SECONDS",
    "process_alive",
    "not_permitted",
    "storage_error",
]

TEMP_MARKER = ".ferry-tmp-"
#: A temp file whose writer cannot be checked (another host) is stale only after this long
#: without a change: a writer streaming into it touches it far more often.
STALE_TEMP_SECONDS = 15 * 60


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


Liveness = Literal["alive", "dead", "unknown"]


@dataclass(frozen=True)
class WriterId:
    """Who a writer process is, in a form another process can check: the host name, the pid, the
    PID (and time) namespace it counts that pid in, the kernel's boot id and the process' start
    time (clock ticks after boot, ``/proc/PID/stat`` field 22). A pid says nothing across
    namespaces (containers with host networking share a host name, not a PID namespace) nor
    across boots, and a pid is reused: the start time tells the holder from its successor.
    ``ns``/``boot``/``start`` are None where unknown (another platform, an older ferry)."""

    host: str
    pid: int
    ns: str | None
    boot: str | None
    start: int | None


def _read_text(path: str, limit: int = 4096) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit).decode("ascii", "replace")
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks after boot) of process ``pid`` from /proc; None if unreadable."""
    text = _read_text(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # the name in parentheses may hold spaces and ')'
    try:
        return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
    except (IndexError, ValueError):
        return None


def _namespaces() -> str | None:
    """This process' PID namespace, plus its time namespace where the kernel has them (start times
    are shifted per time namespace): ``pid:[4026531836]/time:[4026531834]``. None: unknown."""
    if sys.platform != "linux":
        return "-"  # no PID namespaces: a pid is the host's
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return None  # /proc is another PID namespace's (unshare -p without a new /proc): pids can't be checked
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    with contextlib.suppress(OSError):
        ns += "/" + os.readlink("/proc/self/ns/time")
    return ns


def _boot_id() -> str | None:
    if sys.platform != "linux":
        return "-"
    text = _read_text("/proc/sys/kernel/random/boot_id")
    return text.strip() if text and text.strip() else None


_SELF: list[tuple[int, WriterId]] = []  # (pid, identity): computed once per process, again after a fork


def this_writer() -> WriterId:
    """This process' :class:`WriterId`."""
    pid = os.getpid()
    if not _SELF or _SELF[0][0] != pid:
        ns = _namespaces()
        stat = _proc_stat(pid) if sys.platform == "linux" and ns is not None else None
        me = WriterId(socket.gethostname(), pid, ns, _boot_id(), stat[1] if stat else None)
        _SELF[:] = [(pid, me)]
    return _SELF[0][1]


def writer_liveness(writer: WriterId) -> tuple[Liveness, str]:
    """Whether the process ``writer`` names runs: ("alive" | "dead" | "unknown", why). "unknown" for
    one this process cannot see — another host, boot or PID namespace, or no identity recorded —
    which callers must treat as alive until its lease or temp file runs out by time."""
    me = this_writer()
    if writer.host != me.host:
        return "unknown", f"holder on another host ({writer.host!r})"
    if writer.ns is None or writer.boot is None:
        return "unknown", "holder recorded no PID namespace or boot id (an older ferry)"
    if me.ns is None or me.boot is None:
        return "unknown", "this process cannot read its own PID namespace or boot id"
    if writer.boot != me.boot:
        return "unknown", "holder on another boot of this host name (another machine, or before a reboot)"
    if writer.ns != me.ns:
        return "unknown", "holder in another PID namespace (another container on this host)"
    return _pid_liveness(writer.pid, writer.start)


def _pid_liveness(pid: int, start: int | None) -> tuple[Liveness, str]:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "dead", f"no process {pid} in this PID namespace"
    except PermissionError:
        pass  # exists, another user's
    except (OverflowError, ValueError):
        return "dead", f"no process {pid} (not a pid)"
    stat = _proc_stat(pid) if sys.platform == "linux" else None
    if stat is None:
        return "alive", f"process {pid} exists"  # /proc hidden (hidepid) or gone this instant: alive
    if stat[0] in ("Z", "X"):
        return "dead", f"process {pid} has exited (zombie)"
    if start is not None and stat[1] != start:
        return "dead", f"pid {pid} belongs to another process now (started at tick {stat[1]}, not {start})"
    return "alive", f"process {pid} runs"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists in this PID namespace (one we may not signal counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_BASE36 = "0123456789abcdefghijklmnopqrstuvwxyz"


def _base36(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = _BASE36[r] + out
        if not n:
            return out


_PLACE_CACHE: dict[WriterId, str] = {}


def _place(w: WriterId) -> str:
    """12 hex digits naming (host, PID namespace, boot): where a pid means one process. "u" when
    this process cannot tell its namespace or boot (its temp files then go stale by age only)."""
    if w.ns is None or w.boot is None:
        return "u"
    got = _PLACE_CACHE.get(w)
    if got is None:
        key = "\0".join((w.host, w.ns, w.boot)).encode()
        got = _PLACE_CACHE[w] = hashlib.blake2s(key, digest_size=6).hexdigest()
    return got


def temp_name(path: str) -> str:
    """A unique temp path beside ``path`` (same directory, so a rename is atomic).

    The name carries its writer — ``PLACE.PID.START.RANDOM``: a hash of the host name, PID
    namespace and boot id, the pid and the process' start time (base 36) — so a cleaner never
    deletes a temp file that a live writer is still filling, also across containers."""
    me = this_writer()
    head, tail = posixpath.split(path)
    start = _base36(me.start) if me.start is not None else "u"
    return posixpath.join(head, f"{TEMP_MARKER}{_place(me)}.{me.pid}.{start}.{uuid.uuid4().hex[:8]}-{tail}")


class TempWriter(NamedTuple):
    """Who made a temp file: ``place`` (see :func:`temp_name`; an older name's is its host hash), the
    pid, and the process' start time (None: an older name, or unknown)."""

    place: str
    pid: int
    start: int | None


_TAG = re.compile(r"(?P<place>[0-9a-fu]{1,16})\.(?P<pid>[0-9]{1,10})(?:\.(?P<start>[0-9a-zu]{1,16}))?\.[0-9a-f]{1,32}")


def temp_writer(name: str) -> TempWriter | None:
    """The writer of temp file ``name``; None for a name that carries none."""
    base = posixpath.basename(name)
    if not base.startswith(TEMP_MARKER):
        return None
    m = _TAG.fullmatch(base[len(TEMP_MARKER) :].split("-", 1)[0])
    if m is None:
        return None
    start = m.group("start")
    return TempWriter(m.group("place"), int(m.group("pid")), None if start in (None, "u") else int(start, 36))


def temp_is_stale(name: str, age_seconds: float | None) -> bool:
    """Whether temp file ``name`` may be deleted: its writer (same host, PID namespace and boot, named
    in the new form) is gone, or — writer elsewhere, unknown or named in an older form — it has not
    changed for ``STALE_TEMP_SECONDS``."""
    writer = temp_writer(name)
    me = this_writer()
    if writer is not None and writer.start is not None and len(writer.place) == 12 and writer.place == _place(me):
        state, _ = _pid_liveness(writer.pid, writer.start)
        return state == "dead"
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


def write_temp_beside(path: str, data: bytes | memoryview | tuple[bytes, ...]) -> str:
    """A whole, fsync'ed temp file beside ``path`` (a tuple of pieces written in order); its name. Nothing is
    left behind if writing fails."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as f:
            for piece in data if isinstance(data, tuple) else (data,):
                f.write(piece)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_local_write(path: str, data: bytes | memoryview | tuple[bytes, ...], *, sync_dir: bool = False) -> None:
    """Temp file beside ``path`` (a tuple of pieces written in order), fsync'ed, renamed over it;
    ``sync_dir`` also makes the rename itself durable (for the objects whose name is the commit:
    manifest.json, the lease)."""
    parent = os.path.dirname(path) or "."
    tmp = write_temp_beside(path, data)
    try:
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


_NO_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.ENOSYS, errno.EMLINK})


def link_new(tmp: str, path: str) -> bool:
    """Give the finished file ``tmp`` the name ``path`` only if nothing has that name (a file, a directory, a
    symbolic link, even a dangling one): True when done, False when the name is taken. A hard link, so the
    check and the naming are one step; ``tmp`` stays for the caller to remove. On a filesystem without hard
    links: a check, then a rename (two writers racing there may both write)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in _NO_LINKS:
            raise
        if os.path.lexists(path):
            return False
        os.replace(tmp, path)
    return True


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

    A new session parses botocore's service models again before the first request of every dataset
    opened, and of every DataLoader worker; a shared one makes a client without that parse. Not
    where the caller chose a session or a profile (``fs.kwargs``), nor once the filesystem has a client.
    The session is set on the filesystem, not in its storage options, which stay picklable."""
    if getattr(fs, "session", True) is not None or getattr(fs, "_s3", None) is not None or getattr(fs, "kwargs", None):
        return
    if not _S3_SESSION:  # two threads may both make one: harmless, the first stays
        import aiobotocore.session

        _S3_SESSION.append(aiobotocore.session.AioSession())
    fs.session = _S3_SESSION[0]
    fs._session_is_owned = False  # s3fs's flag for a caller's session: a refresh keeps it
