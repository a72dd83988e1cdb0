"""Stored formats 2 and 3 (shard_tools.format.seekable): frames, frame index, digests, bounds — pure, in memory."""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash
import zstandard

from ferry.client.fetching.frames import FrameReader
from ferry.shard_tools.errors import ManifestError, ShardDigestError, ShardFormatError
from ferry.shard_tools.format.digest import TreeHasher, digest_bytes, raw_digest, tree_digest
from ferry.shard_tools.format.manifest import ShardInfo, ShardTable
from ferry.shard_tools.format.seekable import (
    DEFAULT_FRAME_SIZE,
    MIN_FRAME_SIZE,
    decode_frame,
    encode_seekable,
    encode_shard_frames,
    find_index,
    load_index,
    parse_index,
)
from ferry.shard_tools.format.shard import decompress, encode_shard_buffer, parse_shard

FRAME = MIN_FRAME_SIZE  # small frames: many of them in a small shard


def raw_shard(docs: int = 300, seed: int = 0) -> tuple[bytes, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 200, size=docs)
    offsets = np.zeros(docs + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = rng.integers(0, 50000, size=int(offsets[-1])).astype(np.uint16)
    return encode_shard_buffer(tokens, offsets, "uint16").to_pybytes(), tokens, offsets


def row(raw: bytes, stored: bytes) -> ShardInfo:
    """The manifest row of a stored shard, in the format its index is of (3: a tree-shaped raw digest)."""
    n = find_index(memoryview(stored), "t")
    view = parse_shard(raw, shard="t")
    version, frame_size = (
        struct.unpack_from("<I", stored, len(stored) - 8)[0],
        struct.unpack_from("<I", stored, len(stored) - 28)[0],
    )
    frame_size = frame_size if version == 3 else 0
    return ShardInfo(
        path=f"shards/t.s{version}.arrow.zst",
        documents=view.num_documents,
        tokens=view.num_tokens,
        stored_bytes=len(stored),
        raw_bytes=len(raw),
        stored_digest=digest_bytes(stored),
        raw_digest=raw_digest(raw, frame_size),
        index_bytes=n,
        index_digest=digest_bytes(stored[-n:]),
        frame_size=frame_size,
    )


def reader_over(stored: bytes, reads: list[tuple[int, int]] | None = None) -> FrameReader:
    def read_range(info: ShardInfo, offset: int, length: int) -> bytes:
        if reads is not None:
            reads.append((offset, length))
        return stored[offset : offset + length]

    return FrameReader(read_range)


@pytest.mark.parametrize("frame_size", [FRAME, 64 << 10, DEFAULT_FRAME_SIZE])
def test_round_trip_and_plain_zstd_reads_it(frame_size: int) -> None:
    raw, _, _ = raw_shard()
    stored = encode_seekable(raw, 1, frame_size)
    assert decompress(stored, len(raw), "t") == raw
    assert encode_seekable(raw, 1, frame_size) == stored  # deterministic
    # the index is a skippable frame: any zstd decoder reading across frames gives back the Arrow file
    plain = zstandard.ZstdDecompressor().stream_reader(stored, read_across_frames=True).read()
    assert plain == raw
    info = row(raw, stored)
    index = load_index(stored[-info.index_bytes :], info)
    assert index.frames == -(-len(raw) // frame_size)


def test_index_maps_token_and_document_ranges() -> None:
    raw, tokens, offsets = raw_shard()
    stored = encode_seekable(raw, 3, FRAME)
    info = row(raw, stored)
    frames = reader_over(stored)
    for a, b in [(0, 1), (100, 5000), (len(tokens) - 7, len(tokens)), (0, len(tokens))]:
        assert np.array_equal(frames.tokens(info, np.dtype("uint16"), a, b), tokens[a:b])
    assert np.array_equal(frames.offsets(info, 0, info.documents), offsets)
    assert frames.offsets(info, 17, 18).tolist() == offsets[17:19].tolist()


def test_one_token_range_is_the_index_and_one_or_two_ranged_reads() -> None:
    raw, tokens, _ = raw_shard(docs=2000)
    stored = encode_seekable(raw, 1, FRAME)
    info = row(raw, stored)
    reads: list[tuple[int, int]] = []
    frames = reader_over(stored, reads)
    itemsize = 2
    pos = frames.index(info).tokens_pos
    a = (3 * FRAME - pos) // itemsize - 10  # 20 bytes straddling the frame 2 / frame 3 boundary
    got = frames.tokens(info, np.dtype("uint16"), a, a + 20)
    assert np.array_equal(got, tokens[a : a + 20])
    index = frames.index(info)
    # the index, frame 0 (the Arrow head the index is checked against), then frames 2 and 3 in one read
    assert reads == [(info.stored_bytes - info.index_bytes, info.index_bytes), index.span(0),
                     (index.span(2)[0], index.span(2)[1] + index.span(3)[1])]  # fmt: skip
    assert frames.stats.frames == 3 and frames.stats.frame_reads == 2
    frames.tokens(info, np.dtype("uint16"), a, a + 20)
    assert len(reads) == 3 and frames.stats.hits == 2  # the block cache


def test_flipped_byte_in_one_frame_is_detected_when_that_frame_is_read() -> None:
    raw, tokens, _ = raw_shard(docs=2000)
    stored = bytearray(encode_seekable(raw, 1, FRAME))
    info = row(raw, bytes(stored))
    index = parse_index(stored[-info.index_bytes :], shard="t", stored_bytes=len(stored), raw_bytes=len(raw))
    victim = 5
    offset, length = index.span(victim)
    stored[offset + length // 2] ^= 0x01
    frames = reader_over(bytes(stored))
    assert np.array_equal(frames.tokens(info, np.dtype("uint16"), 0, 10), tokens[:10])  # frame 0: fine
    start = (victim * FRAME - index.tokens_pos) // 2 + 4
    with pytest.raises(ShardDigestError, match="frame 5 does not match"):
        frames.tokens(info, np.dtype("uint16"), start, start + 4)
    with pytest.raises(ShardDigestError, match="frame 5"):
        decode_frame(index, victim, stored[offset : offset + length], info.path)
    with pytest.raises(ShardDigestError, match="frame 5"):
        decompress(bytes(stored), len(raw), "t")  # the whole-shard path checks every frame as well


def _index_with(stored: bytes, edit: int, value: int) -> bytes:
    """The shard with entry field ``edit`` (0: stored size of frame 0) of its index set to ``value``."""
    n = find_index(memoryview(stored), "t")
    body = bytearray(stored)
    struct.pack_into("<I", body, len(stored) - n + 8 + edit, value)
    return bytes(body)


def test_truncated_index_is_a_format_error() -> None:
    raw, _, _ = raw_shard()
    stored = encode_seekable(raw, 1, FRAME)
    info = row(raw, stored)
    tail = stored[-info.index_bytes :]
    for cut in (1, 24, len(tail) - 8):
        with pytest.raises(ShardFormatError):
            load_index(tail[cut:], info)
        with pytest.raises(ShardFormatError):
            parse_index(tail[:-cut], shard="t", stored_bytes=len(stored), raw_bytes=len(raw))
    with pytest.raises(ShardFormatError):
        decompress(stored[: len(stored) - 30], len(raw), "t")

    def short(info: ShardInfo, offset: int, length: int) -> bytes:
        return stored[offset : offset + length][:-5]  # the store holds a truncated copy

    with pytest.raises(ShardFormatError, match="truncated"):
        FrameReader(short).index(info)


def test_index_pointing_outside_the_shard_is_a_format_error_even_when_its_digest_agrees() -> None:
    raw, _, _ = raw_shard()
    stored = encode_seekable(raw, 1, FRAME)
    bad = _index_with(stored, 0, 10**9)  # frame 0 "is" a gigabyte long
    info = row(raw, stored)
    forged = ShardInfo(**{**vars(info), "index_digest": digest_bytes(bad[-info.index_bytes :])})
    with pytest.raises(ShardFormatError, match="outside the shard"):
        load_index(bad[-info.index_bytes :], forged)
    with pytest.raises(ShardFormatError, match="outside the shard"):
        reader_over(bad).index(forged)
    with pytest.raises(ShardFormatError):
        decompress(bad, len(raw), "t")


def test_index_claiming_a_bomb_or_wrong_frames_is_refused_before_decoding() -> None:
    raw, _, _ = raw_shard()
    stored = encode_seekable(raw, 1, FRAME)
    n = find_index(memoryview(stored), "t")
    with pytest.raises(ShardFormatError, match="frames of"):
        parse_index(stored[-n:], shard="t", stored_bytes=len(stored), raw_bytes=len(raw) * 1000)
    with pytest.raises(ShardFormatError, match="raw sizes"):
        parse_index(_index_with(stored, 4, FRAME + 1)[-n:], shard="t", stored_bytes=len(stored), raw_bytes=len(raw))
    # a frame that claims to hold more than its header says: the frame's own header check refuses it
    index = parse_index(stored[-n:], shard="t", stored_bytes=len(stored), raw_bytes=len(raw))
    offset, length = index.span(0)
    other = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * (2 * FRAME))
    forged = stored[:offset] + other + stored[offset + length :]
    with pytest.raises(ShardFormatError):
        decompress(forged, len(raw), "t")


def test_frame_digest_is_of_the_stored_frame() -> None:
    raw, _, _ = raw_shard()
    stored = encode_seekable(raw, 1, FRAME)
    n = find_index(memoryview(stored), "t")
    index = parse_index(stored[-n:], shard="t", stored_bytes=len(stored), raw_bytes=len(raw))
    for k in range(index.frames):
        offset, length = index.span(k)
        assert index.digest(k) == xxhash.xxh3_128_digest(stored[offset : offset + length])


def _info(i: int, index_bytes: int = 0) -> ShardInfo:
    digest = f"xxh128:{i:032x}"
    return ShardInfo(f"shards/{i:032x}.arrow.zst", 1, 10, 100, 120, digest, digest, index_bytes,
                     digest if index_bytes else "")  # fmt: skip


def test_shard_table_keeps_format_1_columns_and_mixes_formats() -> None:
    old = ShardTable.from_rows([_info(1), _info(2)])
    assert not old.seekable and len(old._table.schema) == 7  # a format-1 table is byte-for-byte what it was
    new = ShardTable.from_rows([_info(3, 40)])
    mixed = ShardTable.from_ipc(old.concat(new).to_ipc())
    mixed.validate()
    assert [s.stored_format for s in mixed] == [1, 1, 2]
    assert mixed[2].index_bytes == 40 and mixed[2].index_digest == _info(3, 40).index_digest
    assert mixed[0].index_digest == "" and mixed[0].index_bytes == 0
    back = ShardTable.from_ipc(new.concat(old).to_ipc())  # format 1 appended after format 2
    assert [s.stored_format for s in back] == [2, 1, 1] and back[1].index_digest == ""
    three = ShardTable.from_rows([ShardInfo(**{**vars(_info(4, 40)), "frame_size": FRAME})])
    assert len(new._table.schema) == 9 and len(three._table.schema) == 10  # the frame size only where needed
    for table in (ShardTable.from_ipc(mixed.concat(three).to_ipc()), ShardTable.from_ipc(three.concat(mixed).to_ipc())):
        table.validate()
        assert sorted(s.stored_format for s in table) == [1, 1, 2, 3]
        assert sorted(s.frame_size for s in table) == [0, 0, 0, FRAME]


@pytest.mark.parametrize(
    "bad",
    [
        {"index_digest": ""},  # format 2 without a digest
        {"index_bytes": 0},  # a digest on a format-1 row
        {"index_bytes": 1000},  # an index larger than the shard
        {"index_digest": "xxh128:zz"},
        {"index_bytes": 0, "index_digest": "", "frame_size": FRAME},  # a frame size without an index
        {"frame_size": 1},  # a leaf a byte: hashing the shard would take one Python step per byte
        {"frame_size": 1 << 40},  # beyond any frame ferry writes
    ],
)
def test_shard_table_refuses_inconsistent_index_columns(bad: dict[str, object]) -> None:
    rows = [_info(1, 40), ShardInfo(**{**vars(_info(2, 40)), **bad}), _info(3, 40)]
    table = ShardTable.from_rows(rows)
    with pytest.raises(ManifestError):
        ShardTable.from_ipc(table.to_ipc()).validate()


def test_frames_that_lie_about_their_size_cost_what_they_yield_not_what_they_claim() -> None:
    import tracemalloc

    # 1000 frames whose headers (and a consistent index) claim 512 KiB each, 500 MiB in all, but hold
    # only a truncated block: the first one fails, and nothing near the claim was ever allocated
    whole = zstandard.ZstdCompressor(write_content_size=True).compress(np.arange(DEFAULT_FRAME_SIZE // 4).tobytes())
    frame = whole[:40]
    count = 1000
    raw_bytes = count * DEFAULT_FRAME_SIZE
    entries = b"".join(struct.pack("<II16s", len(frame), DEFAULT_FRAME_SIZE, xxhash.xxh3_128_digest(frame))
                       for _ in range(count))  # fmt: skip
    trailer = struct.pack("<IIQQI4s", count, DEFAULT_FRAME_SIZE, 0, 64, 2, b"FSI2")
    payload = entries + trailer
    stored = frame * count + struct.pack("<II", 0x184D2A5E, len(payload)) + payload
    tracemalloc.start()
    try:
        with pytest.raises(ShardFormatError, match="frame 0"):
            decompress(stored, raw_bytes, "t")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20


def test_a_batch_of_ranges_is_fetched_in_parallel_then_read_from_the_block_cache() -> None:
    import threading

    shards = [raw_shard(docs=600, seed=s) for s in range(4)]
    stored = [encode_seekable(raw, 1, FRAME) for raw, _, _ in shards]
    infos = [ShardInfo(**{**vars(row(raw, st)), "path": f"shards/{i}.s3.arrow.zst"})
             for i, ((raw, _, _), st) in enumerate(zip(shards, stored, strict=True))]  # fmt: skip
    by_path = {info.path: st for info, st in zip(infos, stored, strict=True)}
    lock, in_flight, most = threading.Lock(), [0], [0]
    four = threading.Event()

    def read_range(info: ShardInfo, offset: int, length: int) -> bytes:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            if in_flight[0] >= 4:
                four.set()
        four.wait(2.0)  # a slow link: each read waits until four are in flight (bounded)
        with lock:
            in_flight[0] -= 1
        return by_path[info.path][offset : offset + length]

    frames = FrameReader(read_range, threads=4)
    items = [(info, 100 * i, 100 * i + 2000) for i, info in enumerate(infos)]
    frames.prefetch_tokens(items, np.dtype("uint16"))
    assert most[0] >= 4 and frames.stats.index_reads == 4
    fetched = frames.stats.frame_reads
    for (info, a, b), (_, tokens, _) in zip(items, shards, strict=True):
        assert np.array_equal(frames.tokens(info, np.dtype("uint16"), a, b), tokens[a:b])
    assert frames.stats.frame_reads == fetched and frames.stats.index_reads == 4  # all from the cache
    frames.close()


def test_a_shard_is_encoded_as_pieces_written_unjoined_to_any_store(tmp_path: Path) -> None:
    """Format 2's frames are kept apart (joining them cost a fifth of compressing them) and written one after
    the other; what lands, locally or on a remote store, is the same stored shard its row describes."""
    from ferry.shard_tools.format.seekable import encode_shard_frames
    from ferry.shard_tools.storage.store import resolve

    raw, _, _ = raw_shard()
    encoded = encode_shard_frames(raw, 1, FRAME)
    whole = encode_seekable(raw, 1, FRAME)
    assert len(encoded.pieces) > 2 and b"".join(encoded.pieces) == whole == encoded.stored
    assert encoded.stored_bytes == len(whole) and encoded.stored_digest == digest_bytes(whole)
    for url in (str(tmp_path / "local"), "memory://ferry-test-pieces"):
        loc = resolve(url)
        loc.write_bytes("shards/x.s2.arrow.zst", encoded.pieces)
        assert loc.read_bytes("shards/x.s2.arrow.zst") == whole


@pytest.mark.parametrize("frame_size", [FRAME, 5000, 64 << 10])
def test_the_tree_raw_digest_is_the_same_however_the_raw_bytes_arrive(frame_size: int) -> None:
    """Packing (from the frames), a cache check of a file (in 8 MiB reads) and a fetch (in whatever the
    decoder yields) compute one raw digest of a format-3 shard; it depends on the frame size, and is no flat
    digest."""
    raw, _, _ = raw_shard(docs=2000)
    encoded = encode_shard_frames(raw, 1, frame_size)
    assert encoded.raw_digest == tree_digest(raw, frame_size) == raw_digest(raw, frame_size)
    rng = np.random.default_rng(1)
    for _ in range(5):
        hasher = TreeHasher(frame_size)
        cuts = np.sort(rng.integers(0, len(raw), size=int(rng.integers(1, 40))))
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(raw)], strict=True):
            hasher.update(raw[a:b])
        assert hasher.hexdigest() == encoded.raw_digest and hasher.nbytes == len(raw)
    assert tree_digest(raw, frame_size * 2) != encoded.raw_digest != digest_bytes(raw)
    assert encode_shard_frames(raw, 1, frame_size, 2).raw_digest == digest_bytes(raw) == raw_digest(raw, 0)


def test_a_format_3_frame_must_decode_to_its_leaf_and_the_leaves_to_the_raw_digest() -> None:
    """What the stored and index digests cannot say (they are recomputed by whoever rewrote the shard), the
    leaves can: a frame of other raw bytes fails its leaf; leaves of other bytes fail the raw digest; an index
    of the other format, or of another frame size, is refused by the row."""
    raw, _, _ = raw_shard(docs=2000)
    stored = encode_seekable(raw, 1, FRAME)
    info = row(raw, stored)
    index = load_index(stored[-info.index_bytes :], info)
    assert index.version == 3 and index.root(len(raw)) == info.raw_digest
    other = zstandard.ZstdCompressor(write_content_size=True).compress(raw[3 * FRAME : 4 * FRAME])
    sizes = np.where(np.arange(index.frames) == 2, len(other), index.stored_sizes)
    digests = index.digests[:32] + xxhash.xxh3_128_digest(other) + index.digests[48:]
    forged = dataclasses.replace(index, digests=digests, stored_sizes=sizes)  # frame 2's entry made to agree
    with pytest.raises(ShardDigestError, match="frame 2 does not decode to the raw bytes its leaf"):
        decode_frame(forged, 2, other, "t")
    lying_leaves = dataclasses.replace(
        index, leaves=index.leaves[:32] + xxhash.xxh3_128_digest(raw[3 * FRAME : 4 * FRAME]) + index.leaves[48:]
    )
    assert lying_leaves.root(len(raw)) != info.raw_digest
    with pytest.raises(ShardFormatError, match="format-3 frame index, its manifest row says format 2"):
        load_index(stored[-info.index_bytes :], dataclasses.replace(info, frame_size=0))
    with pytest.raises(ShardFormatError, match="frames of 4096 bytes, the manifest 8192"):
        load_index(stored[-info.index_bytes :], dataclasses.replace(info, frame_size=8192))
    two = encode_seekable(raw, 1, FRAME, version=2)
    with pytest.raises(ShardFormatError, match="format-2 frame index, its manifest row says format 3"):
        load_index(two[-row(raw, two).index_bytes :], dataclasses.replace(row(raw, two), frame_size=FRAME))
    with pytest.raises(ShardFormatError, match="is a format-2 shard, not read by frames"):
        reader_over(two).index(row(raw, two))
