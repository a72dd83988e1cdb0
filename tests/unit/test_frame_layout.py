"""A frame index is checked against the Arrow head of the file it describes before anything is read through it
(ferry.shard_tools.format.seekable.check_layout, ferry.client.fetching.frames.FrameReader), and every frame against
its leaf of the raw digest: lies the index digest cannot catch."""

from __future__ import annotations

import struct
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
import xxhash
import zstandard
from test_seekable_format import FRAME, raw_shard, row

from ferry.client.fetching.frames import FrameReader
from ferry.shard_tools.errors import ShardDigestError, ShardError, ShardFormatError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.manifest import ShardInfo
from ferry.shard_tools.format.seekable import (
    check_layout,
    decode_head,
    encode_seekable,
    find_index,
    load_index,
    max_index_bytes,
    parse_index,
)
from ferry.shard_tools.format.shard import encode_shard_buffer, parse_shard

_TRAILER = struct.Struct("<IIQQI4s")


def _entry(index_bytes: int, frames: int) -> int:
    """Bytes per index entry: 24, or 40 with the raw leaf (format 3)."""
    return (index_bytes - 8 - _TRAILER.size) // frames


def _split(stored: bytes) -> tuple[list[bytes], bytearray]:
    n = find_index(memoryview(stored), "t")
    count, frame_size, *_ = _TRAILER.unpack_from(stored, len(stored) - _TRAILER.size)
    e = _entry(n, count)
    sizes = [struct.unpack_from("<I", stored, len(stored) - n + 8 + e * k)[0] for k in range(count)]
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [stored[a:b] for a, b in zip(offsets, offsets[1:], strict=False)], bytearray(stored[-n:])


def _positions(by: tuple[int, int] | None = None, to: tuple[int, int] | None = None) -> Callable[[bytes], bytes]:
    """Move (``by``) or set (``to``) the index's (offsets_pos, tokens_pos)."""

    def lie(stored: bytes) -> bytes:
        frames, index = _split(stored)
        count, size, offsets_pos, tokens_pos, version, tag = _TRAILER.unpack_from(index, len(index) - _TRAILER.size)
        if by is not None:
            offsets_pos, tokens_pos = offsets_pos + by[0], tokens_pos + by[1]
        if to is not None:
            offsets_pos, tokens_pos = to
        _TRAILER.pack_into(index, len(index) - _TRAILER.size, count, size, offsets_pos, tokens_pos, version, tag)
        return b"".join(frames) + bytes(index)

    return lie


def _swap(a: int, b: int) -> Callable[[bytes], bytes]:
    """Frames ``a`` and ``b`` swapped with their stored sizes and digests (their raw leaves left in place)."""

    def lie(stored: bytes) -> bytes:
        frames, index = _split(stored)
        e = _entry(len(index), len(frames))
        entries = [bytes(index[8 + e * k : 32 + e * k]) for k in range(len(frames))]
        frames[a], frames[b] = frames[b], frames[a]
        entries[a], entries[b] = entries[b], entries[a]
        for k, entry in enumerate(entries):
            index[8 + e * k : 32 + e * k] = entry
        return b"".join(frames) + bytes(index)

    return lie


def _rewrite_head(edit: Callable[[bytearray], None]) -> Callable[[bytes], bytes]:
    """Frame 0 decoded, edited, compressed again, its index entry made to agree (but for its raw leaf)."""

    def lie(stored: bytes) -> bytes:
        frames, index = _split(stored)
        raw = bytearray(zstandard.ZstdDecompressor().decompress(frames[0]))
        edit(raw)
        frames[0] = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(raw))
        struct.pack_into("<II16s", index, 8, len(frames[0]), len(raw), xxhash.xxh3_128_digest(frames[0]))
        return b"".join(frames) + bytes(index)

    return lie


def _find(raw: bytearray, old: bytes, new: bytes) -> None:
    at = raw.index(old)
    raw[at : at + len(old)] = new


# lies of the index's Arrow positions, caught by the layout check; the rest rewrite frames, caught by their leaves
LIES: dict[str, Callable[[bytes], bytes]] = {
    "tokens position moved on by a token": _positions(by=(0, 2)),
    "tokens position moved back by a token": _positions(by=(0, -2)),
    "offsets position moved on by a document": _positions(by=(4, 0)),
    "both moved by the same amount": _positions(by=(8, 8)),
    "tokens position at the offsets": _positions(to=(440, 440)),
    "positions inside the metadata": _positions(to=(16, 24)),
    "frames 0 and 1 swapped": _swap(0, 1),
    "frame 0 without the Arrow magic": _rewrite_head(lambda raw: _find(raw, b"ARROW1", b"ARROW2")),
    "column renamed in frame 0": _rewrite_head(lambda raw: _find(raw, b"tokens", b"tokenz")),
}
POSITION_LIES = {name for name in LIES if "position" in name or "moved" in name}


def _forged(lie: Callable[[bytes], bytes]) -> tuple[bytes, ShardInfo]:
    """A shard told the lie, under a row whose stored and index digests agree with it (the raw digest not)."""
    raw, _, _ = raw_shard(docs=600)
    stored = lie(encode_seekable(raw, 1, FRAME))
    info = row(raw, encode_seekable(raw, 1, FRAME))
    n = find_index(memoryview(stored), "t")
    forged = ShardInfo(**{**vars(info), "stored_bytes": len(stored), "stored_digest": digest_bytes(stored),
                          "index_bytes": n, "index_digest": digest_bytes(stored[-n:])})  # fmt: skip
    return stored, forged


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("name", list(LIES))
def test_a_lying_index_is_refused_before_a_token_is_read_through_it(name: str, threads: int) -> None:
    stored, info = _forged(LIES[name])
    assert load_index(stored[-info.index_bytes :], info)  # the index agrees with its row: only its content lies
    frames = FrameReader(lambda _info, offset, length: stored[offset : offset + length], threads=threads)
    dtype = np.dtype("uint16")
    frames.prefetch_tokens([(info, 0, 50), (info, 3000, 3100)], dtype)  # a batch: indexes, heads, frames
    assert not [key for key in frames._blocks if key[0] == info.path]  # nothing it read stays cached
    if name in POSITION_LIES:
        with pytest.raises(ShardFormatError, match=f"{info.path}: frame index (places|does not match)"):
            frames.tokens(info, dtype, 3000, 3100)
    else:
        with pytest.raises(ShardDigestError, match=f"{info.path}: frame 0 does not decode to the raw bytes its leaf"):
            frames.tokens(info, dtype, 3000, 3100)
    with pytest.raises(ShardError, match=info.path):
        frames.offsets(info, 0, info.documents)
    frames.close()


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
@pytest.mark.parametrize("frame_size", [FRAME, 64 << 10])
def test_every_shard_ferry_writes_passes_the_check(dtype: str, frame_size: int) -> None:
    rng = np.random.default_rng(3)
    names = pa.array([f"doc-{i}" for i in range(3000)]).dictionary_encode()  # a dictionary message first
    for docs, extra in [(0, None), (1, None), (500, None), (500, {"mask": pa.array(rng.integers(0, 2, 500))}),
                        (3000, {"source": names})]:  # fmt: skip
        lengths = rng.integers(0, 100, size=docs)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        tokens = rng.integers(0, 60000, size=int(offsets[-1]))
        raw = encode_shard_buffer(tokens, offsets, dtype, extra).to_pybytes()
        stored = encode_seekable(raw, 1, frame_size)
        info = row(raw, stored)
        frames = FrameReader(lambda _info, offset, length, s=stored: s[offset : offset + length])
        view = parse_shard(raw, shard="t")
        if docs:
            got = frames.tokens(info, np.dtype(dtype), 0, info.tokens)
            assert np.array_equal(got, view.tokens)
            assert np.array_equal(frames.offsets(info, 0, docs), view.offsets)
        assert frames.index(info).itemsize == np.dtype(dtype).itemsize
        if info.tokens:
            with pytest.raises(ShardFormatError, match="bit token ids"):
                frames.tokens(info, np.dtype("uint32" if dtype == "uint16" else "uint16"), 0, 1)


def test_the_head_frame_is_checked_whole() -> None:
    raw, _, _ = raw_shard(docs=2000)
    stored = encode_seekable(raw, 1, 64 << 10)
    info = row(raw, stored)
    index = load_index(stored[-info.index_bytes :], info)
    offset, length = index.span(0)
    frame = bytearray(stored[offset : offset + length])
    assert decode_head(index, frame, index.offsets_pos, info.path) == raw[: index.offsets_pos]
    assert check_layout(raw[: index.offsets_pos], index, info).itemsize == 2
    frame[-3] ^= 1  # past the head: still refused (the digest is of the whole stored frame)
    with pytest.raises(ShardDigestError, match="frame 0"):
        decode_head(index, frame, index.offsets_pos, info.path)
    # a frame 0 whose header claims another content size, its digest made to agree
    other = zstandard.ZstdCompressor(write_content_size=True).compress(raw[: index.frame_size // 2])
    entry = struct.pack("<II16s", len(other), index.frame_size, xxhash.xxh3_128_digest(other)) + index.leaves[:16]
    lying = parse_index(
        stored[-info.index_bytes :][:8] + entry + stored[-info.index_bytes + 8 + len(entry) :], shard="t",
        stored_bytes=len(stored) - length + len(other), raw_bytes=len(raw),
    )  # fmt: skip
    with pytest.raises(ShardFormatError, match="frame says"):
        decode_head(lying, other, index.offsets_pos, info.path)


def test_a_row_claiming_an_index_longer_than_any_is_refused_before_reading() -> None:
    """A manifest row whose index would be larger than any index of its raw size (a terabyte, say) is refused
    before a byte is asked of a replica (a ranged read of that length would allocate for it)."""
    raw, _, _ = raw_shard()
    stored = encode_seekable(raw, 1, FRAME)
    info = row(raw, stored)
    reads: list[tuple[int, int]] = []

    def read_range(_info: ShardInfo, offset: int, length: int) -> bytes:
        reads.append((offset, length))
        return stored[offset : offset + length]

    assert info.index_bytes <= max_index_bytes(info.raw_bytes) < info.stored_bytes
    huge = ShardInfo(**{**vars(info), "stored_bytes": 1 << 40, "index_bytes": (1 << 40) - 100})
    with pytest.raises(ShardFormatError, match="no index of a"):
        FrameReader(read_range).tokens(huge, np.dtype("uint16"), 0, 10)
    assert reads == []


def test_a_shard_of_empty_documents_packs_to_format_3_and_reads_by_frames() -> None:
    """`ferry pack --no-eos` of empty documents: no token at all (Arrow keeps no values buffer in the file)."""
    raw = encode_shard_buffer(np.zeros(0, dtype=np.uint16), np.zeros(4, dtype=np.int64), "uint16").to_pybytes()
    stored = encode_seekable(raw, 1, FRAME)
    info = row(raw, stored)
    assert (info.documents, info.tokens) == (3, 0)
    frames = FrameReader(lambda _info, offset, length: stored[offset : offset + length])
    assert frames.offsets(info, 0, 3).tolist() == [0, 0, 0, 0]
    assert frames.tokens(info, np.dtype("uint16"), 0, 0).shape == (0,)
