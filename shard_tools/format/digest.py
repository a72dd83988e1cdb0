"""Content digests: ``xxh128:<hex>`` strings, computed in one go or while streaming.

xxHash's XXH3-128 runs at several GB/s per core, so hashing never limits packing,
syncing or loading; it detects corruption (not tampering; datasets are trusted data).

The raw digest of a stored-format-3 shard is *tree-shaped*, so one frame's raw bytes can be checked
against it without the rest (:func:`tree_root`): with ``F`` the frame size, ``n`` frames and
``leaf_k`` = XXH3-128 of raw bytes ``[k*F, min((k+1)*F, raw_bytes))``, it is the XXH3-128 of
``tag | u64 F | u64 raw_bytes | leaf_0 | ... | leaf_{n-1}`` (little-endian; ``tag`` is the 14 ASCII
bytes ``ferry-raw-tree`` and one zero byte). Every other raw digest (formats 1 and 2) is the XXH3-128
of the whole raw file; the manifest row's frame size (0 for those) says which (:func:`raw_hasher`).
"""

from __future__ import annotations

import struct

import xxhash

from ..errors import ManifestError

ALGORITHM = "xxh128"


class Hasher:
    """Incremental digest; ``update`` with chunks, ``hexdigest`` gives ``xxh128:<hex>``."""

    __slots__ = ("_h", "nbytes")

    def __init__(self) -> None:
        self._h = xxhash.xxh3_128()
        self.nbytes = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)
        self.nbytes += len(data)

    def hexdigest(self) -> str:
        return f"{ALGORITHM}:{self._h.hexdigest()}"


class TreeHasher:
    """Incremental tree-shaped raw digest (see the module docstring) of raw bytes fed in any chunks."""

    __slots__ = ("frame_size", "nbytes", "_leaf", "_in_leaf", "_leaves")

    def __init__(self, frame_size: int) -> None:
        if frame_size <= 0:
            raise ValueError(f"frame size must be positive, got {frame_size}")
        self.frame_size = frame_size
        self.nbytes = 0
        self._leaf = xxhash.xxh3_128()
        self._in_leaf = 0
        self._leaves: list[bytes] = []

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        size, pos = self.frame_size, 0
        if self._in_leaf:  # the rest of the frame the last chunk began
            pos = min(size - self._in_leaf, len(view))
            self._leaf.update(view[:pos])
            self._in_leaf += pos
            if self._in_leaf == size:
                self._leaves.append(self._leaf.digest())
                self._leaf.reset()
                self._in_leaf = 0
        while len(view) - pos >= size:  # whole frames in one call each (at most len(data) / frame_size)
            self._leaves.append(xxhash.xxh3_128_digest(view[pos : pos + size]))
            pos += size
        if pos < len(view):  # the start of a frame the next chunk goes on with
            self._leaf.update(view[pos:])
            self._in_leaf = len(view) - pos
        self.nbytes += len(view)

    def leaves(self) -> list[bytes]:
        """The leaf digests so far, the partial last frame's included."""
        return self._leaves + ([self._leaf.digest()] if self._in_leaf else [])

    def hexdigest(self) -> str:
        return tree_root(self.frame_size, self.nbytes, b"".join(self.leaves()))


_TREE_TAG = b"ferry-raw-tree\x00"
_TREE_HEAD = struct.Struct("<QQ")


def tree_root(frame_size: int, raw_bytes: int, leaves: bytes | bytearray | memoryview) -> str:
    """The tree-shaped raw digest of ``raw_bytes`` raw bytes in frames of ``frame_size`` whose leaf digests
    (16 bytes each, in order) are ``leaves``."""
    h = xxhash.xxh3_128(_TREE_TAG)
    h.update(_TREE_HEAD.pack(frame_size, raw_bytes))
    h.update(leaves)
    return f"{ALGORITHM}:{h.hexdigest()}"


def leaf_digest(raw: bytes | bytearray | memoryview) -> bytes:
    """The 16-byte leaf digest of one frame's raw bytes."""
    return xxhash.xxh3_128_digest(raw)


def tree_digest(raw: bytes | bytearray | memoryview, frame_size: int) -> str:
    """The tree-shaped raw digest of a whole raw file in frames of ``frame_size``."""
    view = memoryview(raw).cast("B")
    leaves = b"".join(leaf_digest(view[a : a + frame_size]) for a in range(0, len(view), frame_size))
    return tree_root(frame_size, len(view), leaves)


def raw_hasher(frame_size: int) -> Hasher | TreeHasher:
    """The incremental raw digest a manifest row calls for: tree-shaped over frames of ``frame_size``
    (stored format 3), the flat digest of the whole file when it is 0 (formats 1 and 2)."""
    return TreeHasher(frame_size) if frame_size else Hasher()


def raw_digest(raw: bytes | bytearray | memoryview, frame_size: int) -> str:
    """The raw digest of a whole raw file as a manifest row with ``frame_size`` records it (see
    :func:`raw_hasher`)."""
    return tree_digest(raw, frame_size) if frame_size else digest_bytes(raw)


def digest_bytes(data: bytes | bytearray | memoryview) -> str:
    """Digest of a whole buffer, as ``xxh128:<hex>``."""
    return f"{ALGORITHM}:{xxhash.xxh3_128_hexdigest(data)}"


def check_digest_string(value: str) -> str:
    """Validate the form of a digest string read from a manifest and return it."""
    algo, _, hexpart = value.partition(":")
    if algo != ALGORITHM or len(hexpart) != 32 or any(c not in "0123456789abcdef" for c in hexpart):
        raise ManifestError(f"unsupported or malformed digest {value!r} (expected xxh128:<32 hex>)")
    return value
