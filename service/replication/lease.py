"""The writer lease of a destination: one replicating writer per dataset copy, visibly.

A writer (the daemon, or ``ferry sync``) takes ``<dataset>/.ferry-lease.json`` before it
copies into a destination and keeps renewing it while it works; a second writer finds it
held, by whom and until when, and stays out (``LeaseHeldError``) instead of racing the first
one — publishing over it, or deleting its temp files as stale. Taking, renewing, releasing
and breaking are compare-and-swaps (:mod:`ferry.shard_tools.storage.conditional`), so two writers that race
for a free lease cannot both win, and ``ferry lease break`` never breaks a lease that a new
writer took after it was shown.

A lease ends when released, when it expires (``ttl`` seconds after the last renewal, by the
wall clock: hosts must agree on the time to well within ``ttl``), or at once when its holder
is seen to be gone: same host name, same boot, same PID (and time) namespace, and its pid no
longer runs the process that took the lease (its start time tells it from a reused pid). A
holder this process cannot see — another host, boot or container, or a lease written by an
older ferry without that identity — counts as alive until the lease expires.

A lease file that is not a valid lease (garbage, missing fields, NaN/infinite/negative expiry,
an expiry further ahead than any ttl allows, bigger than a lease can be) counts as expired:
it can never block writers forever. It is said once per process, in a warning.

A writer whose lease was taken over or broken finds out at its next renewal and stops starting
copies into that destination; it does not publish. Publishing does not depend on the lease
anyway: ``manifest.json`` is swapped by CAS, so even a writer that lost its lease while paused
can never roll a destination back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import stat
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from ferry.shard_tools.errors import LeaseHeldError, StorageError, WriteConflictError
from ferry.shard_tools.storage.conditional import read_versioned, write_if
from ferry.shard_tools.storage.store import Liveness, Location, WriterId, this_writer, writer_liveness
from ferry.shard_tools.threadname import start_named_thread

__all__ = [
    "LEASE_FILE",
    "DEFAULT_TTL",
    "MAX_TTL",
    "MAX_LEASE_BYTES",
    "LeaseInfo",
    "LeaseView",
    "Lease",
    "read_lease",
    "view_lease",
    "break_lease",
    "safe_text",
]

LEASE_FILE = ".ferry-lease.json"
DEFAULT_TTL = 60.0
#: The longest ttl a writer may take; an expiry more than ``_AHEAD_FACTOR`` of these ahead is invalid.
MAX_TTL = 3600.0
_AHEAD_FACTOR = 4
#: A lease is a few hundred bytes; a bigger file is not parsed (and one over ``_READ_LIMIT`` not read).
MAX_LEASE_BYTES = 64 * 1024
_READ_LIMIT = 16 * 1024 * 1024
_MAX_PID = 1 << 22  # Linux's highest pid_max
_MAX_TEXT = 256
_log = logging.getLogger("ferry.lease")
_warned: set[tuple[str, str | None]] = set()
_warned_lock = threading.Lock()


def safe_text(value: object, limit: int = 120) -> str:
    r"""``value`` as one printable line of at most about ``limit`` characters: control and other
    unprintable characters escaped (``\x1b``, ``\u2028``), so a value from storage cannot send a
    terminal escape or forge a line."""
    text = str(value)
    cut = len(text) > limit
    out = "".join(
        ch if ch.isprintable() else (f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}")
        for ch in text[:limit]
    )
    return out + ("…" if cut else "")


@dataclass(frozen=True)
class LeaseInfo:
    """What a lease file says: who holds it and until when (seconds since the epoch). ``ns``,
    ``boot`` and ``start`` identify the holder process across containers (see
    :class:`ferry.shard_tools.storage.store.WriterId`); None in a lease an older ferry wrote."""

    holder: str
    kind: str
    host: str
    pid: int
    acquired_at: float
    expires_at: float
    ns: str | None = None
    boot: str | None = None
    start: int | None = None

    def writer(self) -> WriterId:
        return WriterId(self.host, self.pid, self.ns, self.boot, self.start)

    def liveness(self) -> tuple[Liveness, str]:
        """Whether this host can see the holder run: ("alive" | "dead" | "unknown", why)."""
        return writer_liveness(self.writer())

    def expired(self, now: float) -> bool:
        return now >= self.expires_at or self.liveness()[0] == "dead"

    def describe(self) -> str:
        left = min(max(0.0, self.expires_at - time.time()), _AHEAD_FACTOR * MAX_TTL)
        return (
            f"{safe_text(self.kind, 20)} {safe_text(self.holder)} (pid {self.pid} on {safe_text(self.host, 64)}, "
            f"lease for {left:.0f} s more)"
        )

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def check(cls, data: bytes, now: float | None = None) -> LeaseInfo | str:
        """The lease in ``data``, or why it is not a valid one (a reason, which callers treat as expired)."""
        if len(data) > MAX_LEASE_BYTES:
            return f"the file is {len(data)} bytes, more than a lease's {MAX_LEASE_BYTES}"
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return "not JSON"
        if not isinstance(doc, dict):
            return "not a JSON object"
        try:
            info = cls(
                holder=_text(doc, "holder"), kind=_text(doc, "kind"), host=_text(doc, "host"), pid=_pid(doc),
                acquired_at=_time(doc, "acquired_at"), expires_at=_time(doc, "expires_at"),
                ns=_text(doc, "ns", optional=True), boot=_text(doc, "boot", optional=True), start=_start(doc),
            )  # fmt: skip
        except ValueError as exc:
            return str(exc)
        now = time.time() if now is None else now
        ahead = _AHEAD_FACTOR * MAX_TTL
        if info.expires_at > now + ahead:
            return f"expires_at lies more than {ahead:.0f} s ahead (no lease runs that long)"
        if info.acquired_at > now + ahead:
            return f"acquired_at lies more than {ahead:.0f} s ahead"
        return info

    @classmethod
    def parse(cls, data: bytes) -> LeaseInfo | None:
        """The lease in ``data``; None for a file that is not a valid one (treated as expired)."""
        got = cls.check(data)
        return got if isinstance(got, LeaseInfo) else None


def _text(doc: dict[str, Any], key: str, *, optional: bool = False) -> Any:
    value = doc.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > _MAX_TEXT:
        raise ValueError(f"{key} is missing or not a string of 1 to {_MAX_TEXT} characters")
    return value


def _pid(doc: dict[str, Any]) -> int:
    value = doc.get("pid")
    if type(value) is not int or not 0 < value <= _MAX_PID:
        raise ValueError(f"pid is missing or not an integer from 1 to {_MAX_PID}")
    return value


def _start(doc: dict[str, Any]) -> int | None:
    value = doc.get("start")
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < 1 << 63:
        raise ValueError("start is not a non-negative integer")
    return value


def _time(doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{key} is missing or not a number")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{key} is not a finite, non-negative number of seconds")
    return seconds


@dataclass(frozen=True)
class LeaseView:
    """A lease file as read once: its CAS token, its size and what it says — a valid lease
    (``info``, maybe expired or released) or why it is none (``problem``). ``exists`` False: no file."""

    url: str
    exists: bool
    token: str | None
    size: int
    info: LeaseInfo | None
    problem: str | None

    def active(self, now: float | None = None) -> LeaseInfo | None:
        """The lease if someone holds it now."""
        info = self.info
        return info if info is not None and not info.expired(time.time() if now is None else now) else None


def view_lease(loc: Location) -> LeaseView:
    """Read ``loc``'s lease file once (bounded: a file over 16 MiB, or locally anything but a regular
    file — a FIFO, a link to /dev/zero — is not read)."""
    if loc.local:
        with contextlib.suppress(FileNotFoundError):
            st = os.lstat(loc.full(LEASE_FILE))
            if not stat.S_ISREG(st.st_mode):
                return LeaseView(loc.url, True, None, st.st_size, None, "not a regular file: not a lease")
    with contextlib.suppress(FileNotFoundError):
        size = loc.size(LEASE_FILE)
        if size > _READ_LIMIT:
            return LeaseView(loc.url, True, None, size, None, f"the file is {size} bytes: not a lease")
    got = read_versioned(loc, LEASE_FILE)
    if got.data is None:
        return LeaseView(loc.url, False, None, 0, None, None)
    checked = LeaseInfo.check(got.data)
    if isinstance(checked, str):
        return LeaseView(loc.url, True, got.token, len(got.data), None, checked)
    return LeaseView(loc.url, True, got.token, len(got.data), checked, None)


def _unread_size(loc: Location) -> int | None:
    try:
        return os.lstat(loc.full(LEASE_FILE)).st_size if loc.local else loc.size(LEASE_FILE)
    except FileNotFoundError:
        return None


def _warn_invalid(view: LeaseView) -> None:
    """Say once per process and lease content that an invalid lease file counts as expired."""
    key = (view.url, view.token)
    with _warned_lock:
        if key in _warned:
            return
        if len(_warned) >= 1024:  # a file rewritten with new garbage again and again: memory stays bounded
            _warned.clear()
        _warned.add(key)
    _log.warning(
        "the writer lease at %s is not valid (%s): it counts as expired", safe_text(view.url, 200), view.problem
    )


def read_lease(loc: Location) -> LeaseInfo | None:
    """The lease at ``loc`` if someone holds it now (None: free, expired, released or invalid)."""
    view = view_lease(loc)
    if view.problem is not None:
        _warn_invalid(view)
    return view.active()


def break_lease(loc: Location, view: LeaseView, *, reason: str = "") -> LeaseInfo | None:
    """End the lease ``view`` showed, only if the file still is exactly that one (compare-and-swap):
    WriteConflictError when it changed meanwhile (a new writer took it). A valid lease is replaced by
    an expired one of kind ``broken`` naming who broke it (returned); an oversized file is deleted."""
    if not view.exists:
        raise WriteConflictError(f"{loc.url}: there is no lease to break")
    me = this_writer()
    who = f"broken:{me.host}:{me.pid}:{uuid.uuid4().hex[:8]}"
    if view.token is None:  # not read (too big, not a file): no token to swap against; delete if unchanged
        if _unread_size(loc) != view.size:
            raise WriteConflictError(f"{loc.url}: the lease file changed since it was read")
        loc.remove(LEASE_FILE)
        _log.warning("removed the unreadable lease file at %s (%s)", safe_text(loc.url, 200), view.problem)
        return None
    now = time.time()
    mark = LeaseInfo(who, "broken", me.host, me.pid, now, 0.0, me.ns, me.boot, me.start)
    write_if(loc, LEASE_FILE, mark.to_json(), view.token)
    held = view.info.describe() if view.info is not None else f"an invalid lease ({view.problem})"
    _log.warning("broke the writer lease at %s held by %s%s", safe_text(loc.url, 200), held,
                 f": {safe_text(reason)}" if reason else "")  # fmt: skip
    return mark


class Lease:
    """This process' lease on one destination. ``acquire`` or fail; ``keep`` renews it from a
    thread until ``release``. Use as a context manager: ``with Lease(loc, "sync"): ...``."""

    def __init__(self, loc: Location, kind: str, *, ttl: float = DEFAULT_TTL) -> None:
        if not 0 < ttl <= MAX_TTL:
            raise ValueError(f"lease ttl must be positive and at most {MAX_TTL:.0f} s")
        self.loc = loc
        self.kind = kind
        self.ttl = ttl
        me = this_writer()
        self.holder = f"{kind}:{me.host}:{me.pid}:{uuid.uuid4().hex[:8]}"
        self._token: str | None = None
        self._acquired_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # why the lease was lost while held (None: still ours)
        self.lost_to = ""  # the holder that took it over, or who broke it ("" unknown)

    def _info(self, expires_at: float) -> LeaseInfo:
        me = this_writer()
        return LeaseInfo(self.holder, self.kind, me.host, me.pid, self._acquired_at, expires_at, me.ns, me.boot,
                         me.start)  # fmt: skip

    def acquire(self) -> None:
        """Take the lease, or raise LeaseHeldError naming the live holder."""
        for _ in range(8):
            view = view_lease(self.loc)
            if view.exists and view.token is None:
                raise StorageError(
                    f"{self.loc.url}/{LEASE_FILE}: {view.problem}; look at it, then remove it "
                    f"(ferry lease break {self.loc.url})",
                    retryable=False,
                )
            if view.problem is not None:
                _warn_invalid(view)
            now = time.time()
            info = view.info
            if info is not None and info.holder != self.holder and not info.expired(now):
                raise LeaseHeldError(
                    f"{self.loc.url} is being written by {info.describe()}; wait for it or stop it",
                    holder=info.holder,
                )
            self._acquired_at = now
            try:
                self._token = write_if(self.loc, LEASE_FILE, self._info(now + self.ttl).to_json(), view.token)
            except WriteConflictError:
                continue  # someone else moved first: look again
            return
        raise LeaseHeldError(f"{self.loc.url}: the writer lease kept changing hands; try again", retryable=True)

    def renew(self) -> bool:
        """Extend the lease; False (and ``lost`` set) when another writer took it, or it was broken."""
        if self._token is None:
            return False
        try:
            self._token = write_if(self.loc, LEASE_FILE, self._info(time.time() + self.ttl).to_json(), self._token)
        except WriteConflictError:
            self._token = None
            lost, lost_to = "the lease was taken over or broken", ""
            with contextlib.suppress(StorageError):
                view = view_lease(self.loc)
                taker = view.active()
                if view.info is not None and view.info.kind == "broken":
                    lost = f"the lease was broken by {safe_text(view.info.holder)} (ferry lease break)"
                    lost_to = view.info.holder
                elif taker is not None:
                    lost = f"the lease was taken over by {taker.describe()}"
                    lost_to = taker.holder
            # set once the reason is known, lost last: a thread that sees ``lost`` set sees why, and who
            self.lost_to = lost_to
            self.lost = lost
            _log.warning("lost the writer lease of %s: %s", safe_text(self.loc.url, 200), lost)
            return False
        return True

    def keep(self) -> None:
        """Renew every ttl/3 from a daemon thread until ``release``."""

        def run() -> None:
            while not self._stop.wait(self.ttl / 3):
                try:
                    if not self.renew():
                        return
                except StorageError:
                    continue  # a passing storage error: try again at the next tick, while the lease runs

        self._thread = start_named_thread(run, "ferry-lease")

    def release(self) -> None:
        """Give the lease up (an expired lease in its place), if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._token is None:
            return
        with contextlib.suppress(WriteConflictError, StorageError):  # taken over or unreachable: it expires
            write_if(self.loc, LEASE_FILE, self._info(0.0).to_json(), self._token)
        self._token = None

    def __enter__(self) -> Lease:
        self.acquire()
        self.keep()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
