"""A frame index that lies, under a manifest that agrees with it: what ``ferry verify`` rejects, the frame path
does not deliver (it raises naming the shard, or reads the shard whole, verified against its raw digest).

The manifest rows of these lies keep the raw digest of the true content and have their stored and index
digests (and sizes) recomputed for the lie: a consistent lie. Format 3 (the default) binds every frame to
the raw digest; format-2 shards are read whole.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
import zstandard
from test_seekable_datasets import FRAME, SHARD, make_docs, write_input

from ferry.client.stream.dataset import TokenDataset
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.errors import ShardError
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.format.header import MANIFEST_FILE, version_path
from ferry.shard_tools.format.manifest import Manifest, ShardTable
from ferry.shard_tools.format.seekable import FrameIndex, find_index, parse_index
from ferry.shard_tools.packer.packing import PackOptions, pack
from ferry.shard_tools.verification import verify

VICTIM = 1
_TRAILER_AT = 32  # the trailer: u32 n, u32 F, u64 offsets_pos, u64 tokens_pos, u32 version, 4 bytes tag
TOKEN_FRAME = 2  # a frame of token ids (frames 0 and 1 hold the Arrow metadata and offsets)

Pieces = tuple[list[bytes], bytearray, FrameIndex]


def pieces(url: str, shard: int) -> Pieces:
    """The frames of a format-2 shard, its index (editable) and the parsed index."""
    info = open_dataset(url).manifest.shards[shard]
    body = Path(url, info.path).read_bytes()
    n = find_index(memoryview(body), info.path)
    index = parse_index(body[-n:], shard=info.path, stored_bytes=len(body), raw_bytes=info.raw_bytes)
    frames = [body[o : o + length] for o, length in (index.span(k) for k in range(index.frames))]
    return frames, bytearray(body[-n:]), index


def entry_size(index: bytes | bytearray, frames: int) -> int:
    """Bytes per frame entry of an index (24 in format 2, 40 with the raw leaf in format 3)."""
    return (len(index) - 8 - _TRAILER_AT) // frames


def entries(index: bytes | bytearray, frames: int) -> list[bytearray]:
    e = entry_size(index, frames)
    return [bytearray(index[8 + e * k : 8 + e * (k + 1)]) for k in range(frames)]


def with_entries(index: bytes | bytearray, rows: list[bytearray]) -> bytes:
    return bytes(index[:8]) + b"".join(rows) + bytes(index[len(index) - _TRAILER_AT :])


def republish(url: str, shard: int, frames: list[bytes], index: bytes, **row: Any) -> None:
    """Write the shard as ``frames`` + ``index`` and publish a manifest that agrees with it (stored and index
    digests recomputed, the raw digest still naming the true content, ``row`` changed): a consistent lie."""
    m = open_dataset(url).manifest
    rows = list(m.shards)
    body = b"".join(frames) + index
    Path(url, rows[shard].path).write_bytes(body)
    rows[shard] = dataclasses.replace(
        rows[shard], stored_bytes=len(body), stored_digest=digest_bytes(body), index_bytes=len(index),
        index_digest=digest_bytes(index), **row,
    )  # fmt: skip
    new, table = Manifest.build(
        name=m.name, token_dtype=m.token_dtype, tokenizer=m.tokenizer, eos_appended=m.eos_appended,
        shards=ShardTable.from_rows(rows), parent=m.version_id, created_at=m.created_at, tool_version=m.tool_version,
    )  # fmt: skip
    Path(url, new.table_path).write_bytes(table)
    Path(url, version_path(new.version_id)).write_bytes(new.to_json())
    Path(url, MANIFEST_FILE).write_bytes(new.to_json())


def _move(which: int, by: int) -> Callable[[str], None]:
    """Move the index's offsets (``which`` 0) or tokens (1) position by ``by`` bytes."""

    def lie(url: str) -> None:
        frames, index, _ = pieces(url, VICTIM)
        at = len(index) - _TRAILER_AT + 8 + 8 * which
        index[at : at + 8] = (int.from_bytes(index[at : at + 8], "little") + by).to_bytes(8, "little")
        republish(url, VICTIM, frames, bytes(index))

    return lie


def _swap(a: int, b: int) -> Callable[[str], None]:
    """Swap frames ``a`` and ``b`` with their index entries (each frame still matches its digest)."""

    def lie(url: str) -> None:
        frames, index, _ = pieces(url, VICTIM)
        rows = entries(index, len(frames))
        frames[a], frames[b] = frames[b], frames[a]
        rows[a], rows[b] = rows[b], rows[a]
        republish(url, VICTIM, frames, with_entries(index, rows))

    return lie


def _tokens_at_offsets(url: str) -> None:
    """The tokens position set to the offsets position: both inside the file, in order, on a token boundary."""
    frames, index, parsed = pieces(url, VICTIM)
    at = len(index) - _TRAILER_AT + 16
    index[at : at + 8] = parsed.offsets_pos.to_bytes(8, "little")
    republish(url, VICTIM, frames, bytes(index))


def _other_tokens(url: str, *, leaves: bool = False, downgrade: bool = False, row: bool = False) -> None:
    """Token frame 2 recompressed from other raw content (frame 3's tokens), its index entry (stored size and
    digest; with ``leaves`` its raw leaf too, in format 3) recomputed. ``downgrade``: the index rewritten as a
    format-2 one (no leaves); ``row``: the manifest row says format 2 (no frame size) as well."""
    frames, index, parsed = pieces(url, VICTIM)
    rows = entries(index, len(frames))
    raw = zstandard.ZstdDecompressor().decompress(frames[TOKEN_FRAME + 1])
    assert len(raw) == parsed.frame_size == int(parsed.raw_sizes[TOKEN_FRAME])  # other tokens, the same size
    frames[TOKEN_FRAME] = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(raw)
    rows[TOKEN_FRAME][:4] = struct.pack("<I", len(frames[TOKEN_FRAME]))
    rows[TOKEN_FRAME][8:24] = xxhash.xxh3_128_digest(frames[TOKEN_FRAME])
    if leaves and len(rows[TOKEN_FRAME]) == 40:
        rows[TOKEN_FRAME][24:40] = xxhash.xxh3_128_digest(raw)
    if downgrade:
        rows = [r[:24] for r in rows]
        trailer = bytearray(index[len(index) - _TRAILER_AT :])
        trailer[-8:] = struct.pack("<I4s", 2, b"FSI2")
        payload = b"".join(rows) + trailer
        index = bytearray(struct.pack("<II", 0x184D2A5E, len(payload)) + payload)
    republish(url, VICTIM, frames, with_entries(index, rows), **({"frame_size": 0} if row else {}))


def _swap_leaves(url: str) -> None:
    """Token frames 2 and 3 swapped with their index entries, except their raw leaves (left in place)."""
    frames, index, _ = pieces(url, VICTIM)
    rows = entries(index, len(frames))
    a, b = TOKEN_FRAME, TOKEN_FRAME + 1
    frames[a], frames[b] = frames[b], frames[a]
    rows[a][:24], rows[b][:24] = rows[b][:24], rows[a][:24]
    republish(url, VICTIM, frames, with_entries(index, rows))


def _truncate_last(url: str) -> None:
    """The last frame cut short (its last 8 bytes gone), its index entry recomputed for the bytes left."""
    frames, index, _ = pieces(url, VICTIM)
    rows = entries(index, len(frames))
    frames[-1] = frames[-1][:-8]
    rows[-1][:4] = struct.pack("<I", len(frames[-1]))
    rows[-1][8:24] = xxhash.xxh3_128_digest(frames[-1])
    republish(url, VICTIM, frames, with_entries(index, rows))


def _row_downgrade(url: str) -> None:
    """The manifest row alone says format 2 (frame size 0) over the intact format-3 shard: its raw digest (the
    tree root) is then taken as the digest of the whole file, which it is not."""
    frames, index, _ = pieces(url, VICTIM)
    republish(url, VICTIM, frames, bytes(index), frame_size=0)


LIES = {
    "tokens position moved": _move(1, 14),
    "tokens position moved back": _move(1, -2),
    "offsets position moved": _move(0, 4),
    "offsets position moved back": _move(0, -4),
    "tokens position at the offsets": _tokens_at_offsets,
    "frames 0 and 1 swapped": _swap(0, 1),
    "token frames 2 and 3 swapped": _swap(TOKEN_FRAME, TOKEN_FRAME + 1),
}

# frames past frame 0 that do not hold the true content, under a manifest made consistent with them
CONSISTENT_LIES: dict[str, Callable[[str], None]] = {
    "a token frame recompressed from other tokens": _other_tokens,
    "the same, its leaf recomputed": lambda url: _other_tokens(url, leaves=True),
    "the same, the index downgraded to format 2": lambda url: _other_tokens(url, downgrade=True),
    "the same, index and row downgraded to format 2": lambda url: _other_tokens(url, downgrade=True, row=True),
    "leaves left behind by swapped frames": _swap_leaves,
    "the last frame truncated": _truncate_last,
}


def read(url: str, cache: Path, shuffle: str, boundaries: bool, **kw: Any) -> tuple[Any, int]:
    """Every sample of an epoch (token windows), or where documents start in every 8th (read from the document
    offsets) or the ShardError raised instead; and how many frame indexes were read."""
    ds = TokenDataset(url, seq_len=64, seed=7, shuffle=shuffle, cache_dir=str(cache), **kw)
    try:
        if boundaries:
            got: Any = [list(b) for b in ds.payload(np.arange(0, ds.num_samples, 8), boundaries=True)["boundaries"]]
        else:
            got = np.asarray(ds.payload(np.arange(ds.num_samples))["windows"])
    except ShardError as exc:
        got = exc
    finally:
        stats = ds.reader.frames.stats if ds.reader.frames is not None else None
        ds.close()
    return got, stats.index_reads if stats else 0


def check_not_delivered(tmp_path: Path, lie: Callable[[str], None], shuffle: str, **pack_kw: Any) -> None:
    """Pack one dataset twice, make ``lie`` of one: verify rejects it, and reading it under ``shuffle`` with a
    cache of one shard either raises naming the shard or gives the rows of the true content."""
    inputs, opts = write_input("parquet", tmp_path, make_docs(300, 5))
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    for url in (good, bad):
        pack(inputs, url, PackOptions(shard_size=SHARD, frame_size=FRAME, **pack_kw, **opts))
    shard = open_dataset(bad).manifest.shards[VICTIM]
    lie(bad)
    by_frames = open_dataset(bad).manifest.shards[VICTIM].stored_format == 3  # as the lie's manifest row says
    assert not verify(bad).ok  # what verify rejects ...
    for boundaries in (False, True):  # token windows, then document offsets
        ref, _ = read(good, tmp_path / f"ref{boundaries}", shuffle, boundaries)
        # ... read by frames (a small cache) is read whole, verified (where only the index lied the rows are
        # right), or refused naming the shard: never wrong rows
        got, index_reads = read(bad, tmp_path / f"c{boundaries}", shuffle, boundaries, cache_limit=SHARD)
        if by_frames:
            assert index_reads > 0  # the frame path was taken
        if not any(s.stored_format == 3 for s in open_dataset(bad).manifest.shards):
            assert index_reads == 0  # format 2 is never read by frames
        if isinstance(got, ShardError):
            assert got.shard == shard.path
            continue
        if boundaries:
            assert got == ref
        else:
            wrong = int(np.any(got != ref, axis=1).sum())
            assert got.shape == ref.shape and wrong == 0, f"{wrong} wrong rows of {len(ref)}"


@pytest.mark.parametrize("shuffle", ["global", "window"])
@pytest.mark.parametrize("name", list(LIES))
def test_the_frame_path_does_not_deliver_what_verify_rejects(name: str, shuffle: str, tmp_path: Path) -> None:
    check_not_delivered(tmp_path, LIES[name], shuffle)


@pytest.mark.parametrize("shuffle", ["global", "window"])
@pytest.mark.parametrize("name", list(CONSISTENT_LIES))
def test_frames_of_other_content_under_a_consistent_manifest_are_not_delivered(
    name: str, shuffle: str, tmp_path: Path
) -> None:
    """The default format binds every frame to the raw digest: frames past frame 0 rewritten, with everything
    but the raw digest recomputed to agree (or the index, or the row, passed off as format 2), raise."""
    check_not_delivered(tmp_path, CONSISTENT_LIES[name], shuffle)


@pytest.mark.parametrize("name", ["token frames 2 and 3 swapped", "a token frame recompressed from other tokens"])
def test_format_2_shards_are_read_whole_so_a_consistent_lie_is_not_delivered(name: str, tmp_path: Path) -> None:
    """Format 2 (a flat raw digest: no frame checkable on its own) is read whole under global shuffle, verified."""
    check_not_delivered(tmp_path, {**LIES, **CONSISTENT_LIES}[name], "global", stored_format=2)


def test_a_row_that_passes_a_format_3_shard_off_as_format_2_is_refused(tmp_path: Path) -> None:
    """A downgrade of the manifest row alone (the true frames and index): the tree root is no flat digest."""
    check_not_delivered(tmp_path, _row_downgrade, "global")


@pytest.mark.parametrize("where", ["frame 0", "a token frame", "the index"])
def test_a_replica_with_wrong_bytes_of_the_right_size_is_passed_over_frame_by_frame(where: str, tmp_path: Path) -> None:
    """Frames, heads and indexes read from the first replica that answers with bytes matching their digests:
    a corrupt copy on one replica costs another replica's frames, not a whole-shard read."""
    inputs, opts = write_input("parquet", tmp_path, make_docs(300, 5))
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    for url in (good, bad):
        pack(inputs, url, PackOptions(shard_size=SHARD, frame_size=FRAME, **opts))
    info = open_dataset(bad).manifest.shards[VICTIM]
    _, _, index = pieces(bad, VICTIM)
    offset, length = {"frame 0": index.span(0), "a token frame": index.span(2)}.get(
        where, (info.stored_bytes - info.index_bytes, info.index_bytes)
    )
    path = Path(bad, info.path)
    body = bytearray(path.read_bytes())
    body[offset + length // 2] ^= 0x40
    path.write_bytes(bytes(body))
    ref, _ = read(good, tmp_path / "ref", "global", False)
    ds = TokenDataset([bad, good], seq_len=64, seed=7, shuffle="global", cache_dir=str(tmp_path / "c"),
                      cache_limit=SHARD)  # fmt: skip
    try:
        got = np.asarray(ds.payload(np.arange(ds.num_samples))["windows"])
        assert np.array_equal(got, ref)
        assert ds.reader.frames is not None and ds.reader.frames.stats.index_reads > 0
        assert ds.cache.fetches == 0  # no shard was read whole
    finally:
        ds.close()
