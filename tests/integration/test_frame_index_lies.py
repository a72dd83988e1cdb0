"""A frame index that lies, under a manifest that agrees with it: what ``ferry verify`` rejects, the frame path
does not deliver (it raises naming the shard, or reads the shard whole, verified against its raw digest)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_seekable_datasets import FRAME, SHARD, make_docs, write_input

from ferry.client.dataset import TokenDataset
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.digest import digest_bytes
from ferry.shard_tools.errors import ShardError
from ferry.shard_tools.header import MANIFEST_FILE, version_path
from ferry.shard_tools.manifest import Manifest, ShardTable
from ferry.shard_tools.packing import PackOptions, pack
from ferry.shard_tools.seekable import FrameIndex, find_index, parse_index
from ferry.shard_tools.verification import verify

VICTIM = 1
_TRAILER_AT = 32  # the trailer: u32 n, u32 F, u64 offsets_pos, u64 tokens_pos, u32 version, 4 bytes tag

Pieces = tuple[list[bytes], bytearray, FrameIndex]


def pieces(url: str, shard: int) -> Pieces:
    """The frames of a format-2 shard, its index (editable) and the parsed index."""
    info = open_dataset(url).manifest.shards[shard]
    body = Path(url, info.path).read_bytes()
    n = find_index(memoryview(body), info.path)
    index = parse_index(body[-n:], shard=info.path, stored_bytes=len(body), raw_bytes=info.raw_bytes)
    frames = [body[o : o + length] for o, length in (index.span(k) for k in range(index.frames))]
    return frames, bytearray(body[-n:]), index


def republish(url: str, shard: int, frames: list[bytes], index: bytes) -> None:
    """Write the shard as ``frames`` + ``index`` and publish a manifest that agrees with it (stored and index
    digests recomputed, the raw digest still naming the true content): a consistent lie."""
    m = open_dataset(url).manifest
    rows = list(m.shards)
    body = b"".join(frames) + index
    Path(url, rows[shard].path).write_bytes(body)
    rows[shard] = dataclasses.replace(
        rows[shard], stored_bytes=len(body), stored_digest=digest_bytes(body), index_bytes=len(index),
        index_digest=digest_bytes(index),
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
        entries = [bytes(index[8 + 24 * k : 32 + 24 * k]) for k in range(len(frames))]
        frames[a], frames[b] = frames[b], frames[a]
        entries[a], entries[b] = entries[b], entries[a]
        index[8 : 8 + 24 * len(frames)] = b"".join(entries)
        republish(url, VICTIM, frames, bytes(index))

    return lie


def _tokens_at_offsets(url: str) -> None:
    """The tokens position set to the offsets position: both inside the file, in order, on a token boundary."""
    frames, index, parsed = pieces(url, VICTIM)
    at = len(index) - _TRAILER_AT + 16
    index[at : at + 8] = parsed.offsets_pos.to_bytes(8, "little")
    republish(url, VICTIM, frames, bytes(index))


LIES = {
    "tokens position moved": _move(1, 14),
    "tokens position moved back": _move(1, -2),
    "offsets position moved": _move(0, 4),
    "offsets position moved back": _move(0, -4),
    "tokens position at the offsets": _tokens_at_offsets,
    "frames 0 and 1 swapped": _swap(0, 1),
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


@pytest.mark.parametrize("shuffle", ["global", "window"])
@pytest.mark.parametrize("name", list(LIES))
def test_the_frame_path_does_not_deliver_what_verify_rejects(name: str, shuffle: str, tmp_path: Path) -> None:
    inputs, opts = write_input("parquet", tmp_path, make_docs(300, 5))
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    for url in (good, bad):
        pack(inputs, url, PackOptions(shard_size=SHARD, stored_format=2, frame_size=FRAME, **opts))
    shard = open_dataset(bad).manifest.shards[VICTIM]
    LIES[name](bad)
    assert not verify(bad).ok  # what verify rejects ...
    for boundaries in (False, True):  # token windows, then document offsets
        ref, _ = read(good, tmp_path / f"ref{boundaries}", shuffle, boundaries)
        # ... read by frames (a small cache) is read whole, verified (where only the index lied the rows are
        # right), or refused naming the shard: never wrong rows
        got, index_reads = read(bad, tmp_path / f"c{boundaries}", shuffle, boundaries, cache_limit=SHARD)
        assert index_reads > 0  # the frame path was taken
        if isinstance(got, ShardError):
            assert got.shard == shard.path
            continue
        if boundaries:
            assert got == ref
        else:
            wrong = int(np.any(got != ref, axis=1).sum())
            assert got.shape == ref.shape and wrong == 0, f"{wrong} wrong rows of {len(ref)}"


@pytest.mark.parametrize("where", ["frame 0", "a token frame", "the index"])
def test_a_replica_with_wrong_bytes_of_the_right_size_is_passed_over_frame_by_frame(where: str, tmp_path: Path) -> None:
    """Frames, heads and indexes read from the first replica that answers with bytes matching their digests:
    a corrupt copy on one replica costs another replica's frames, not a whole-shard read."""
    inputs, opts = write_input("parquet", tmp_path, make_docs(300, 5))
    good, bad = str(tmp_path / "good"), str(tmp_path / "bad")
    for url in (good, bad):
        pack(inputs, url, PackOptions(shard_size=SHARD, stored_format=2, frame_size=FRAME, **opts))
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
