"""Reading a media dataset's shards: per shard its document offsets and media metadata, then tokens and
media bytes of the documents a sequence holds, and nothing else.

Format-3 shards are read by frames (:class:`ferry.client.fetching.frames.FrameReader`, every frame checked
against the manifest's raw digest): once per shard per process the head (Arrow metadata, giving where the
media column's buffers lie: :func:`ferry.shard_tools.format.media.media_layout`), the ``tokens`` offsets and
the media metadata region (item offsets and fields, no media bytes); then for each piece of a document its
tokens and its items' bytes, one contiguous range. Shards of stored formats 1 and 2 are fetched whole
(verified against their raw digest) and kept in memory while in use. With the node's disk cache
(:mod:`ferry.client.media.cached`), a shard already in it gives all of that, its metadata too, from the local file.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from ferry.shard_tools.errors import ShardFormatError
from ferry.shard_tools.format.arrays import one_array
from ferry.shard_tools.format.manifest import Manifest, ShardInfo
from ferry.shard_tools.format.media import (
    MEDIA_COLUMN,
    MediaItem,
    MediaLayout,
    MediaMeta,
    binary_offsets,
    item_arrays,
    media_layout,
)
from ferry.shard_tools.format.shard import ShardView, parse_shard

from ..fetching.frames import FrameReader
from .cached import CachedShards

__all__ = ["ShardMedia", "MediaReader"]

_WHOLE_KEPT = 4  # whole shards (formats 1, 2) kept in memory per process
_DATA_KEPT = 8  # shards whose media bytes buffer (from a whole or cached shard) is kept at hand per process
# a dataset whose token streams hold at most this many bytes in all has each shard's read with its metadata (one
# ranged read a shard: placeholder spans compress to little), not a ranged read per document piece
TOKENS_KEPT = 64 << 20


@dataclass(frozen=True)
class ShardMedia:
    """What a shard's documents hold: token offsets and media metadata (no media bytes)."""

    offsets: np.ndarray
    meta: MediaMeta
    layout: MediaLayout | None  # None when the shard was read whole (or from the disk cache)
    tokens: np.ndarray | None = None  # the whole token stream, read by frames with the metadata when kept


class MediaReader:
    """Tokens and media of a media dataset's documents, by frames where the shard allows it."""

    def __init__(
        self,
        manifest: Manifest,
        replicas: Any,
        frames: FrameReader | None,
        known: dict[int, ShardMedia] | None = None,
        cached: CachedShards | None = None,
    ) -> None:
        self.manifest = manifest
        self.replicas = replicas
        self.frames = frames
        self.cached = cached  # the node's disk cache (remote replicas, when asked for), else None
        self.dtype = np.dtype(manifest.token_dtype)
        # shards' metadata another reader of this dataset read and checked (a DataLoader worker's parent's)
        self._meta: dict[int, ShardMedia] = dict(known or {})
        self._whole: OrderedDict[int, ShardView] = OrderedDict()
        # per shard: the view its media bytes were found in, those bytes (the data buffer), the first item's offset
        self._data: OrderedDict[int, tuple[ShardView, memoryview, int]] = OrderedDict()
        self._infos: dict[int, ShardInfo] = {}
        self._keep_tokens = int(manifest.shards.tokens.sum()) * self.dtype.itemsize <= TOKENS_KEPT

    def info(self, s: int) -> ShardInfo:
        """Shard ``s``'s manifest row (made once: a row of the manifest's table is built on each access)."""
        got = self._infos.get(s)
        if got is None:
            got = self._infos[s] = self.manifest.shards[s]
        return got

    @property
    def fetches_ahead(self) -> bool:
        """Whether :meth:`prefetch` does anything: frames read from remote replicas, several at once."""
        return self.frames is not None and self.frames.threads > 1

    def _by_frames(self, info: ShardInfo) -> bool:
        return self.frames is not None and info.stored_format == 3

    def _in_cache(self, s: int) -> ShardView | None:
        """Shard ``s`` mapped from the node's disk cache, if there is one and the shard is in it."""
        return None if self.cached is None else self.cached.view(self.info(s))

    def _frames_for(self, info: ShardInfo) -> FrameReader:
        """The frame reader, for a shard read by frames (which the disk cache, if any, then fetches whole)."""
        assert self.frames is not None
        if self.cached is not None:
            self.cached.fill(info)
        return self.frames

    def _view(self, s: int) -> ShardView:
        if self.cached is not None:
            return self.cached.open(self.info(s))
        view = self._whole.get(s)
        if view is not None:
            self._whole.move_to_end(s)
            return view
        info = self.info(s)
        raw = self.replicas.fetch(info)
        view = parse_shard(raw, shard=info.path, dtype=self.manifest.token_dtype, documents=info.documents)
        self._whole[s] = view
        while len(self._whole) > _WHOLE_KEPT:
            self._whole.popitem(last=False)
        return view

    def shard(self, s: int) -> ShardMedia:
        """Shard ``s``'s document offsets and media metadata (read once per process)."""
        got = self._meta.get(s)
        if got is not None:
            return got
        info = self.info(s)
        # a shard already in the node's disk cache: its metadata from the local file, no ranged reads
        cached = self._in_cache(s) if self.manifest.media is not None and self._by_frames(info) else None
        if self.manifest.media is None:  # a dataset without media: its documents' offsets alone
            got = self._text_only(s, info)
        elif self._by_frames(info) and cached is None:
            assert self.frames is not None
            layout = self._frames_layout(info)
            offsets = self.frames.offsets(info, 0, info.documents)
            a, b = layout.meta_range
            meta = layout.decode(self.frames.raw(info, a, b), info.path)
            tokens = self.frames.tokens(info, self.dtype, 0, info.tokens) if self._keep_tokens else None
            got = ShardMedia(offsets, meta, layout, tokens)
        else:
            view = cached if cached is not None else self._view(s)
            if MEDIA_COLUMN not in view.table.schema.names:
                raise ShardFormatError(info.path, "the dataset has a media policy, the shard no media column")
            meta = MediaMeta.from_column(view.table.column(MEDIA_COLUMN), info.path)
            got = ShardMedia(np.asarray(view.offsets, dtype=np.int64), meta, None)
        got.meta.check(info.path, np.diff(got.offsets))
        if (got.meta.items, got.meta.data_bytes) != (info.media_items, info.media_bytes):
            raise ShardFormatError(info.path, "its media column disagrees with the manifest's media counts")
        self._meta[s] = got
        return got

    def _frames_layout(self, info: ShardInfo) -> MediaLayout:
        """Where the media column's buffers lie in a shard read by frames (from its head)."""
        assert self.frames is not None
        index = self.frames.index(info)
        layout = media_layout(self.frames.raw(info, 0, index.offsets_pos), info)
        if layout is None:
            raise ShardFormatError(info.path, "the dataset has a media policy, the shard no media column")
        return layout

    def _layout(self, s: int, info: ShardInfo) -> MediaLayout:
        """Shard ``s``'s media layout for reading it by frames; read from its head when its metadata came from a
        cached file that has since left the cache."""
        sm = self.shard(s)
        if sm.layout is None:
            sm = self._meta[s] = dataclasses.replace(sm, layout=self._frames_layout(info))
        assert sm.layout is not None
        return sm.layout

    def _text_only(self, s: int, info: ShardInfo) -> ShardMedia:
        if self._by_frames(info):
            assert self.frames is not None
            offsets = self.frames.offsets(info, 0, info.documents)
            tokens = self.frames.tokens(info, self.dtype, 0, info.tokens) if self._keep_tokens else None
        else:
            offsets, tokens = np.asarray(self._view(s).offsets, dtype=np.int64), None
        return ShardMedia(np.asarray(offsets, dtype=np.int64), _no_media(info.documents), None, tokens)

    def load(self, shards: range, make: Callable[[], MediaReader], threads: int) -> list[ShardMedia]:
        """Every shard's metadata, ``threads`` shards at a time (remote replicas: their round trips overlap), each
        thread with a reader of its own from ``make`` (a frame reader serves one thread)."""
        missing = [s for s in shards if s not in self._meta]
        if threads > 1 and len(missing) > 1:
            local = threading.local()

            def one(s: int) -> tuple[int, ShardMedia]:
                if getattr(local, "reader", None) is None:
                    local.reader = make()
                return s, local.reader.shard(s)

            with ThreadPoolExecutor(min(threads, len(missing)), thread_name_prefix="ferry-media-meta") as pool:
                self._meta.update(pool.map(one, missing))
        return [self.shard(s) for s in shards]

    @property
    def known(self) -> dict[int, ShardMedia]:
        """The shards' metadata read so far (immutable: a new reader may start from it)."""
        return dict(self._meta)

    def prefetch(self, spans: list[tuple[int, int, int, int, int]]) -> None:
        """Fetch together (remote replicas: 8 ranged reads in flight) the frames that ``(shard, token a, token b,
        item j0, item j1)`` spans need, so that :meth:`tokens` and :meth:`items` then read from the block cache;
        a failed fetch is left for that read to raise. Nothing to do for local files or whole shards."""
        if self.frames is None or not self.fetches_ahead:
            return
        ranges = []
        for s, a, b, j0, j1 in spans:
            info = self.info(s)
            if not self._by_frames(info) or self._in_cache(s) is not None:
                continue
            sm = self.shard(s)
            frames = self._frames_for(info)  # the disk cache, if any, starts fetching the shard whole now
            # raw byte ranges given as uint8 "tokens" counted from the token buffer's start
            base = frames.index(info).tokens_pos
            if sm.tokens is None:
                ranges.append((info, a * self.dtype.itemsize, b * self.dtype.itemsize))
            lo, hi = int(sm.meta.data_offsets[j0]), int(sm.meta.data_offsets[j1])
            if hi > lo:
                data_pos = self._layout(s, info).data_pos
                ranges.append((info, data_pos + lo - base, data_pos + hi - base))
        if ranges:
            self.frames.prefetch_tokens(ranges, np.dtype("u1"))

    def tokens(self, s: int, a: int, b: int) -> np.ndarray:
        """Tokens ``[a, b)`` of shard ``s``'s token stream."""
        kept = self._meta.get(s)
        if kept is not None and kept.tokens is not None:
            return kept.tokens[a:b]
        info = self.info(s)
        cached = self._in_cache(s)
        if cached is not None:
            return cached.tokens[a:b]
        if self._by_frames(info):
            return self._frames_for(info).tokens(info, self.dtype, a, b)
        return self._view(s).tokens[a:b]

    def items(self, s: int, j0: int, j1: int) -> list[MediaItem]:
        """Media items ``[j0, j1)`` of shard ``s`` with their bytes (one contiguous read)."""
        if j0 == j1:
            return []
        info = self.info(s)
        meta = self.shard(s).meta
        lo, hi = int(meta.data_offsets[j0]), int(meta.data_offsets[j1])
        cached = self._in_cache(s)
        if cached is None and self._by_frames(info):
            data_pos = self._layout(s, info).data_pos
            frames = self._frames_for(info)
            data = bytes(frames.raw(info, data_pos + lo, data_pos + hi)) if hi > lo else b""
        else:
            buffer, first = self._media_bytes(s, cached or self._view(s))
            data = bytes(buffer[first + lo : first + hi])
        base = lo
        return [
            meta.item(j, data[int(meta.data_offsets[j]) - base : int(meta.data_offsets[j + 1]) - base])
            for j in range(j0, j1)
        ]

    def _media_bytes(self, s: int, view: ShardView) -> tuple[memoryview, int]:
        """The media column's data buffer of shard ``s`` in ``view`` and where its first item starts in it, found
        once per view (not per read: combining the column's chunks copies it)."""
        kept = self._data.get(s)
        if kept is not None and kept[0] is view:
            self._data.move_to_end(s)
            return kept[1], kept[2]
        column = view.table.column(MEDIA_COLUMN)
        data = item_arrays(one_array(column))[-1]
        found = (memoryview(data.buffers()[2]), int(binary_offsets(data)[0]))
        self._data[s] = (view, *found)
        while len(self._data) > _DATA_KEPT:
            self._data.popitem(last=False)
        return found


def _no_media(documents: int) -> MediaMeta:
    """The media metadata of ``documents`` documents without media."""
    none = np.zeros(0, dtype=np.int64)
    return MediaMeta(np.zeros(documents + 1, dtype=np.int64), none, none, [], [], none, none,
                     np.zeros(0, dtype=np.float64), none, np.zeros(1, dtype=np.int64))  # fmt: skip
