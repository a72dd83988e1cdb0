"""Video items from their container headers, without decoding a frame: MP4 (ISO BMFF) and WebM (Matroska).

- MP4: the boxes ``moov/mvhd`` (duration and its timescale), and of the first track whose ``mdia/hdlr`` says
  ``vide``: ``tkhd`` (width and height, 16.16 fixed point) and ``mdia/minf/stbl/stsz`` (or ``stz2``: the
  sample count is the frame count). The frames' sizes in ``stsz`` must add up to no more than the ``mdat`` boxes
  hold, and every top-level box must lie inside the file.
- WebM: the EBML header's DocType ``webm``, then in the Segment ``Info`` (``TimecodeScale``, ``Duration``), the
  first video ``TrackEntry`` (``TrackNumber``, ``PixelWidth``, ``PixelHeight``), and the frames counted as the
  ``SimpleBlock`` / ``Block`` elements of that track in the Clusters (block headers only).

Every length is checked against the bytes that hold it before it is used, only the boxes named above are
entered (no recursion), the boxes or elements walked are bounded, and a box or
element that runs past its parent, a missing one, or values outside the limits raise :class:`BadVideoError`
with one line naming the item.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from ..errors import InputFormatError

__all__ = ["BadVideoError", "VideoHeader", "is_mp4", "is_webm", "probe_mp4", "probe_webm"]

MAX_VIDEO_SECONDS = 4 * 3600
MAX_FRAMES = 10_000_000
MAX_SIDE = 32768
_MAX_ELEMENTS = 1 << 20  # boxes or elements walked in one file
_EBML, _SEGMENT, _INFO, _TRACKS, _TRACK, _CLUSTER = 0x1A45DFA3, 0x18538067, 0x1549A966, 0x1654AE6B, 0xAE, 0x1F43B675
_DOCTYPE, _SCALE, _DURATION, _NUMBER, _TYPE, _VIDEO = 0x4282, 0x2AD7B1, 0x4489, 0xD7, 0x83, 0xE0
_WIDTH, _HEIGHT, _SIMPLE_BLOCK, _BLOCK_GROUP, _BLOCK = 0xB0, 0xBA, 0xA3, 0xA0, 0xA1


class BadVideoError(InputFormatError):
    """A video whose container headers are missing, truncated, inconsistent or beyond the limits."""


VideoHeader = tuple[int, int, float, int]  # width, height, duration in seconds, frames


def is_mp4(data: bytes) -> bool:
    return data[4:8] == b"ftyp"


def is_webm(data: bytes) -> bool:
    return data[:4] == b"\x1a\x45\xdf\xa3"


def _checked(where: str, width: int, height: int, duration: float, frames: int) -> VideoHeader:
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE):
        raise BadVideoError(f"{where}: video header says {width}x{height} pixels, beyond the limits")
    if not 0 < duration <= MAX_VIDEO_SECONDS:
        raise BadVideoError(f"{where}: video header says {duration:g} s, outside (0, {MAX_VIDEO_SECONDS}] s")
    if not 0 < frames <= MAX_FRAMES:
        raise BadVideoError(f"{where}: video holds {frames} frames, outside [1, {MAX_FRAMES}]")
    return width, height, duration, frames


# ---------------------------------------------------------------- MP4


class _Walk:
    """Bounds of one file's walk: boxes or elements seen, for :data:`_MAX_ELEMENTS`."""

    def __init__(self, where: str) -> None:
        self.where, self.seen = where, 0

    def count(self) -> None:
        self.seen += 1
        if self.seen > _MAX_ELEMENTS:
            raise BadVideoError(f"{self.where}: more than {_MAX_ELEMENTS} boxes or elements")


def _boxes(data: memoryview, walk: _Walk) -> Iterator[tuple[bytes, memoryview]]:
    """``(type, payload)`` of each box in ``data``, each size checked to lie inside it."""
    pos = 0
    while pos < len(data):
        walk.count()
        if len(data) - pos < 8:
            raise BadVideoError(f"{walk.where}: MP4 box header cut off at byte {pos}")
        size, kind = struct.unpack_from(">I4s", data, pos)
        head = 8
        if size == 1:
            if len(data) - pos < 16:
                raise BadVideoError(f"{walk.where}: MP4 box {kind!r} 64-bit size cut off")
            (size,) = struct.unpack_from(">Q", data, pos + 8)
            head = 16
        elif size == 0:
            size = len(data) - pos
        if size < head or size > len(data) - pos:
            raise BadVideoError(
                f"{walk.where}: MP4 box {kind!r} of {size} bytes at byte {pos} runs past its container "
                "(truncated or corrupt)"
            )
        yield bytes(kind), data[pos + head : pos + size]
        pos += size


def _child(data: memoryview, kind: bytes, walk: _Walk) -> memoryview | None:
    return next((payload for k, payload in _boxes(data, walk) if k == kind), None)


def _path(data: memoryview, kinds: list[bytes], walk: _Walk) -> memoryview | None:
    for kind in kinds:
        found = _child(data, kind, walk)
        if found is None:
            return None
        data = found
    return data


def _unpack(fmt: str, data: memoryview, offset: int, where: str, box: str) -> tuple[int, ...]:
    if offset + struct.calcsize(fmt) > len(data):
        raise BadVideoError(f"{where}: MP4 box {box} is too short")
    return struct.unpack_from(fmt, data, offset)


def _mvhd(moov: memoryview, walk: _Walk) -> float:
    mvhd = _child(moov, b"mvhd", walk)
    if mvhd is None:
        raise BadVideoError(f"{walk.where}: MP4 without moov/mvhd")
    if _unpack(">B", mvhd, 0, walk.where, "mvhd")[0] == 1:
        scale, duration = _unpack(">IQ", mvhd, 20, walk.where, "mvhd")
    else:
        scale, duration = _unpack(">II", mvhd, 12, walk.where, "mvhd")
    if scale == 0:
        raise BadVideoError(f"{walk.where}: MP4 mvhd has a timescale of 0")
    return duration / scale


def _frames(stbl: memoryview, media_bytes: int, walk: _Walk) -> int:
    stsz = _child(stbl, b"stsz", walk)
    if stsz is not None:
        size, count = _unpack(">II", stsz, 4, walk.where, "stsz")
        if size:
            total = size * count
        else:
            if 12 + 4 * count > len(stsz):
                raise BadVideoError(f"{walk.where}: MP4 stsz lists {count} frames, its table is cut off")
            total = sum(struct.unpack_from(f">{count}I", stsz, 12)) if count else 0
        if total > media_bytes:
            raise BadVideoError(f"{walk.where}: MP4 stsz says its frames take {total} bytes, its mdat boxes hold fewer")
        return int(count)
    stz2 = _child(stbl, b"stz2", walk)
    if stz2 is None:
        raise BadVideoError(f"{walk.where}: MP4 video track without stbl/stsz or stz2")
    return int(_unpack(">I", stz2, 8, walk.where, "stz2")[0])


def _video_track(moov: memoryview, walk: _Walk) -> tuple[memoryview, memoryview]:
    """``(tkhd, stbl)`` of the first track whose handler is ``vide``."""
    for kind, trak in _boxes(moov, walk):
        if kind != b"trak":
            continue
        hdlr = _path(trak, [b"mdia", b"hdlr"], walk)
        if hdlr is None or bytes(hdlr[8:12]) != b"vide":
            continue
        tkhd = _child(trak, b"tkhd", walk)
        stbl = _path(trak, [b"mdia", b"minf", b"stbl"], walk)
        if tkhd is None or stbl is None:
            raise BadVideoError(f"{walk.where}: MP4 video track without tkhd or mdia/minf/stbl")
        return tkhd, stbl
    raise BadVideoError(f"{walk.where}: MP4 without a video track (no trak whose hdlr is 'vide')")


def probe_mp4(data: bytes, where: str) -> VideoHeader:
    """Width, height, duration and frame count of an MP4 from its boxes."""
    walk = _Walk(where)
    top = list(_boxes(memoryview(data), walk))  # every top-level box checked to lie inside the file
    moov = next((payload for kind, payload in top if kind == b"moov"), None)
    if moov is None:
        raise BadVideoError(f"{where}: MP4 without a moov box (truncated, or not a complete file)")
    duration = _mvhd(moov, walk)
    tkhd, stbl = _video_track(moov, walk)
    at = 88 if _unpack(">B", tkhd, 0, where, "tkhd")[0] == 1 else 76  # after the matrix
    width, height = (v >> 16 for v in _unpack(">II", tkhd, at, where, "tkhd"))
    media_bytes = sum(len(payload) for kind, payload in top if kind == b"mdat")
    return _checked(where, width, height, duration, _frames(stbl, media_bytes, walk))


# ---------------------------------------------------------------- WebM


def _vint(data: memoryview, pos: int, where: str, keep_marker: bool) -> tuple[int, int]:
    """An EBML variable-length integer at ``pos``: (value, its length); -1 for an unknown size."""
    if pos >= len(data):
        raise BadVideoError(f"{where}: WebM element cut off at byte {pos}")
    first = data[pos]
    length = 9 - first.bit_length() if first else 9
    if length > 8 or pos + length > len(data):
        raise BadVideoError(f"{where}: WebM has a malformed or cut-off number at byte {pos}")
    value = first if keep_marker else first & ((1 << (8 - length)) - 1)
    for b in data[pos + 1 : pos + length]:
        value = (value << 8) | b
    if not keep_marker and value == (1 << (7 * length)) - 1:
        return -1, length
    return value, length


def _elements(data: memoryview, walk: _Walk) -> Iterator[tuple[int, memoryview]]:
    pos = 0
    while pos < len(data):
        walk.count()
        ident, a = _vint(data, pos, walk.where, True)
        size, b = _vint(data, pos + a, walk.where, False)
        start = pos + a + b
        if size < 0:  # unknown size (a live stream's Segment or Cluster): to the end of its parent
            size = len(data) - start
        if size > len(data) - start:
            raise BadVideoError(
                f"{walk.where}: WebM element {ident:#x} of {size} bytes at byte {pos} runs past its parent "
                "(truncated or corrupt)"
            )
        yield ident, data[start : start + size]
        pos = start + size


def _uint(data: memoryview) -> int:
    return int.from_bytes(bytes(data[:8]), "big")


def _float(data: memoryview, where: str) -> float:
    if len(data) not in (4, 8):
        raise BadVideoError(f"{where}: WebM Duration of {len(data)} bytes")
    return float(struct.unpack(">f" if len(data) == 4 else ">d", data)[0])


def _webm_track(tracks: memoryview, walk: _Walk) -> tuple[int, int, int]:
    """``(track number, width, height)`` of the first video track."""
    for ident, entry in _elements(tracks, walk):
        if ident != _TRACK:
            continue
        fields = {i: v for i, v in _elements(entry, walk)}
        if _TYPE in fields and _uint(fields[_TYPE]) == 1 and _VIDEO in fields:
            video = {i: v for i, v in _elements(fields[_VIDEO], walk)}
            if _NUMBER not in fields or _WIDTH not in video or _HEIGHT not in video:
                raise BadVideoError(f"{walk.where}: WebM video track without TrackNumber or pixel size")
            return _uint(fields[_NUMBER]), _uint(video[_WIDTH]), _uint(video[_HEIGHT])
    raise BadVideoError(f"{walk.where}: WebM without a video track")


def _blocks(segment: memoryview, track: int, walk: _Walk) -> int:
    """Blocks of ``track`` in the Segment's Clusters (only each block's track number is read)."""
    frames = 0
    for ident, cluster in _elements(segment, walk):
        if ident != _CLUSTER:
            continue
        for kind, block in _elements(cluster, walk):
            if kind == _BLOCK_GROUP:
                block = next((b for i, b in _elements(block, walk) if i == _BLOCK), memoryview(b""))
            elif kind != _SIMPLE_BLOCK:
                continue
            if len(block) and _vint(block, 0, walk.where, False)[0] == track:
                frames += 1
    return frames


def probe_webm(data: bytes, where: str) -> VideoHeader:
    """Width, height, duration and frame count of a WebM from its elements."""
    walk = _Walk(where)
    top = list(_elements(memoryview(data), walk))
    header = dict(_elements(top[0][1], walk)) if top and top[0][0] == _EBML else {}
    if bytes(header.get(_DOCTYPE, b"")) != b"webm":
        raise BadVideoError(f"{where}: an EBML file whose DocType is not 'webm'")
    segment = next((v for i, v in top if i == _SEGMENT), None)
    if segment is None:
        raise BadVideoError(f"{where}: WebM without a Segment")
    parts = {}
    for ident, value in _elements(segment, walk):
        if ident in (_INFO, _TRACKS) and ident not in parts:
            parts[ident] = value
    if _INFO not in parts or _TRACKS not in parts:
        raise BadVideoError(f"{where}: WebM without Segment Info or Tracks")
    info = dict(_elements(parts[_INFO], walk))
    scale = _uint(info[_SCALE]) if _SCALE in info else 1_000_000
    if _DURATION not in info or scale == 0:
        raise BadVideoError(f"{where}: WebM Info without a Duration (or a TimecodeScale of 0)")
    duration = _float(info[_DURATION], where) * scale / 1e9
    track, width, height = _webm_track(parts[_TRACKS], walk)
    return _checked(where, width, height, duration, _blocks(segment, track, walk))
