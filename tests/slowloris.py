"""A slow-header flood for the API's connection tests: sockets that send a request head a byte at a time.

``FloodProcess`` runs the flood in a child process (``python tests/slowloris.py PORT COUNT DRIP DURATION``),
so the flood's Python loop never stalls the test's own probes between their connect and their request, as a
prober that is its own process (kubelet, curl) is never stalled by an attacker's. The child reports its
counts on stdout, one JSON line a tick.
"""

from __future__ import annotations

import contextlib
import errno
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

from processes import terminate

_Entry = tuple[socket.socket, float, int]  # a slow socket, when it sent its first byte, bytes sent


class SlowLoris:
    """``count`` sockets to ``port``, each sending a request head one byte per ``drip`` seconds; a socket
    the server closes is opened again (at most once per drip), so the pressure stays on. Bounded: stops
    after ``duration`` seconds or at ``stop()``."""

    def __init__(self, port: int, count: int, *, drip: float = 0.5, duration: float = 60.0) -> None:
        self.port, self.count, self.drip, self.duration = port, count, drip, duration
        self.lifetimes: list[float] = []  # seconds from the first byte to the server's close, per closed socket
        self.answers: list[bytes] = []  # the first bytes the server sent before closing
        self.opened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def __enter__(self) -> SlowLoris:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _open(self) -> _Entry | None:
        s = socket.socket()
        s.setblocking(False)  # the connect completes in the background; the first byte goes once it has
        if s.connect_ex(("127.0.0.1", self.port)) not in (0, errno.EINPROGRESS):
            s.close()
            return None
        return s, 0.0, 0

    def _run(self) -> None:
        head = b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
        socks: list[_Entry | None] = [None] * self.count
        end = time.monotonic() + self.duration
        try:
            while not self._stop.is_set() and time.monotonic() < end:
                for i, entry in enumerate(socks):
                    socks[i] = self._tick(entry, head)
                self._stop.wait(self.drip)
        finally:
            for entry in socks:
                if entry is not None:
                    entry[0].close()

    def _tick(self, entry: _Entry | None, head: bytes) -> _Entry | None:
        if entry is None:  # a new socket sends its first byte as soon as it is connected, as a slow client does
            entry = self._open()
            if entry is None:
                return None
        s, born, sent = entry
        if not sent:  # still connecting, or connected and about to send its first byte
            try:
                s.send(head[:1])
            except OSError:
                if _connecting(s):
                    return entry
                s.close()
                return None
            self.opened += 1
            return s, time.monotonic(), 1
        try:
            data = s.recv(4096)
        except BlockingIOError:
            data = None
        except OSError:
            data = b""
        if data is not None:  # the server answered or closed: record, start over next time
            self.lifetimes.append(time.monotonic() - born)
            self.answers.append(data[:64])
            s.close()
            return None
        with contextlib.suppress(OSError):
            s.send(head[sent : sent + 1])
        return s, born, sent + 1


def _connecting(s: socket.socket) -> bool:
    """A non-blocking connect still under way (no error yet and no peer)."""
    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
        return False
    try:
        s.getpeername()
    except OSError:
        return True
    return False


class FloodProcess:
    """A ``SlowLoris`` in a child process; ``opened``, ``closed`` and ``longest`` follow its reports."""

    def __init__(self, port: int, count: int, *, drip: float = 0.5, duration: float = 60.0) -> None:
        self.port, self.count, self.drip, self.duration = port, count, drip, duration
        self.opened = 0  # slow sockets that sent their first byte
        self.closed = 0  # slow sockets the server closed
        self.longest = 0.0  # seconds from a socket's first byte to the server's close, the longest seen
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> FloodProcess:
        args = [sys.executable, __file__, str(self.port), str(self.count), str(self.drip), str(self.duration)]
        self._proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        proc = self._proc
        if proc is None:
            return
        terminate(proc)  # the child closes its sockets and sends a last report
        if self._reader is not None:
            self._reader.join(10)

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            report = json.loads(line)
            self.opened, self.closed, self.longest = report["opened"], report["closed"], report["longest"]


def _report(flood: SlowLoris) -> None:
    longest = max(flood.lifetimes, default=0.0)
    print(json.dumps({"opened": flood.opened, "closed": len(flood.lifetimes), "longest": longest}), flush=True)


def main(argv: list[str]) -> None:
    port, count, drip, duration = int(argv[0]), int(argv[1]), float(argv[2]), float(argv[3])
    flood = SlowLoris(port, count, drip=drip, duration=duration)
    signal.signal(signal.SIGTERM, lambda *_: flood._stop.set())
    with flood:
        while flood._thread.is_alive():
            _report(flood)
            flood._thread.join(0.1)
    _report(flood)


if __name__ == "__main__":
    main(sys.argv[1:])
