"""moto's S3 server, but a ranged GET reads only its range, as S3 does.

moto 5 answers every GET by reading the whole object out of its buffer and then slicing the range, so a
small range of a large object costs it CPU (GIL held) in proportion to the whole object, not the
range. A benchmark of ranged reads would then time moto's copies, not the loaders: ferry's
parallel ranged GETs and frame reads pay the whole object per request, a tool that GETs whole objects
once. Here a GET with one ``Range`` (and no ``partNumber``) hands moto a view of the object that reads
only what is sliced from it; every other request is moto's own code path, unchanged.

Run as ``python bench/moto_ranged.py -H 127.0.0.1 -p PORT`` (the arguments of ``python -m moto.server``).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from moto.s3 import models, responses
from moto.server import main

_ranged = threading.local()


class _Window:
    """A key's bytes that are read from its buffer only where sliced."""

    def __init__(self, key: Any) -> None:
        self.key = key

    def __len__(self) -> int:
        return int(self.key.contentsize)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __getitem__(self, span: slice) -> bytes:
        if not isinstance(span, slice) or span.step not in (None, 1):
            raise TypeError("a key's window is sliced with [a:b] only")
        start, stop, _ = span.indices(len(self))
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return bytes(self.key._value_buffer.read(max(0, stop - start)))


_value = models.FakeKey.value


def _get_value(key: Any) -> Any:
    return _Window(key) if getattr(_ranged, "on", False) else _value.fget(key)


_get_object = responses.S3Response.get_object


def _patched_get_object(self: Any) -> Any:
    rng = self.headers.get("range") or ""
    _ranged.on = rng.startswith("bytes=") and "," not in rng and "partNumber" not in self.querystring
    try:
        return _get_object(self)
    finally:
        _ranged.on = False


_handle_range = responses.S3Response._handle_range_header


def _patched_handle_range(self: Any, request: Any, headers: Any, content: Any) -> Any:
    status, headers, body = _handle_range(self, request, headers, content)
    return status, headers, (body[:] if isinstance(body, _Window) else body)  # a range S3 answers whole


def _install() -> None:
    models.FakeKey.value = property(_get_value, _value.fset)  # type: ignore[method-assign,assignment]
    responses.S3Response.get_object = _patched_get_object  # type: ignore[method-assign]
    responses.S3Response._handle_range_header = _patched_handle_range  # type: ignore[method-assign]


if __name__ == "__main__":
    _install()
    sys.exit(main(sys.argv[1:]))
