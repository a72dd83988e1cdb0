"""``MediaDataset``: a dataset packed with media, read as fixed-length packed sequences with their media.

Each sequence holds ``seq_len`` tokens: pieces of documents (:mod:`ferry.client.media.planner`) back to
back, each media item's placeholder span whole, then padding. A sample carries:

- ``input_ids`` (``seq_len``), ``labels`` (the next token within the same piece; -100 where the next
  token is padding, a placeholder id or past the piece's end), ``position_ids`` (the position in the
  document, so a piece that continues a document goes on counting);
- ``documents``: one row ``(document, start in the sequence, length, start in the document)`` per piece,
  the document boundaries;
- ``media_spans``: one row ``(start in the sequence, length)`` per media item, and ``media``: the items
  in the same order, as :class:`ferry.shard_tools.format.media.MediaItem` (the encoded bytes), or what the
  ``decode`` hook makes of each (run where the sample is made: in the DataLoader's workers);
- ``position``: where the sequence is in the dataset's stream (epochs back to back: the same for any number of
  ranks or workers, see :mod:`ferry.client.media.source`), and ``epoch`` and ``index``, the same place as
  sequence ``index`` of that epoch.

A dataset packed without media reads the same way (sequences without media): a text source of a
:class:`~ferry.client.media.mixed.MediaMixture`.

Only the metadata of each shard (token offsets and media metadata, without media bytes) and the tokens and
media bytes of the documents a sequence holds are read: a sample never fetches another sample's media.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ferry.shard_tools.errors import StateError, UsageError
from ferry.shard_tools.format.manifest import Manifest
from ferry.shard_tools.format.media import MediaItem

from .. import checks
from ..agree import agreed_manifest
from ..fetching.cache import ShardCache
from ..fetching.frames import frame_reader_for
from .cached import CachedShards
from .epochs import EpochIndex
from .planner import Pieces, Plan, cut_pieces, plan_epoch
from .reader import MediaReader, ShardMedia
from .source import MediaSource, check_shape

__all__ = ["MediaDataset", "Decode"]

Decode = Callable[[MediaItem], Any]
IGNORE = -100
_FRAME_BUDGET = 256 << 20
_META_THREADS = 8  # shards whose metadata is read at once from remote replicas


class MediaDataset(MediaSource):
    """Packed sequences with media from a ferry dataset packed with ``--media-policy`` (or without media).

    Args:
        url: dataset URL (or replicas of it, nearest first).
        seq_len: tokens per sequence; every media item's span must fit in one.
        seed: shuffle seed; epoch ``e`` shuffles the document pieces by ``(seed, e)``.
        shuffle: False keeps document order (still packed best-fit).
        max_images: at most this many images per sequence (None: no cap).
        max_frames: at most this many video frames per sequence (None: no cap).
        pad_id: padding id (default: the tokenizer's EOS id, else 0).
        decode: called on each media item where the sample is made; its result goes in ``media``.
        rank, world_size: the rank's share of the stream (:mod:`ferry.client.media.source`); the stream itself
            does not depend on them.
        epochs: epochs to read (None: without end); a reader's last global batch may reach into the next one.
        open_bins: sequences open at once while packing (more: fuller sequences, more planning time).
        storage_options: fsspec options of the URLs.
        cache_dir: a node-local directory to keep shards read from remote replicas in, whole and checked, shared
            by the node's processes (:mod:`ferry.client.media.cached`); None (default): no disk cache.
        cache_limit: the cache directory's bound, bytes or a size string (default ``"50GiB"``).
        version: read this published version (default: the current one; under ``torch.distributed``, the one
            rank 0 read).
    """

    def __init__(
        self,
        url: str | list[str],
        seq_len: int,
        *,
        seed: int = 0,
        shuffle: bool = True,
        max_images: int | None = None,
        max_frames: int | None = None,
        pad_id: int | None = None,
        decode: Decode | None = None,
        rank: int = 0,
        world_size: int = 1,
        epochs: int | None = None,
        open_bins: int = 64,
        storage_options: Mapping[str, Any] | None = None,
        version: str | None = None,
        cache_dir: str | None = None,
        cache_limit: int | str = "50GiB",
    ) -> None:
        from ..fetching.replicas import Replicas

        if seq_len < 2 or open_bins < 1 or (epochs is not None and epochs < 0):
            raise UsageError("MediaDataset: need seq_len >= 2, open_bins >= 1, epochs >= 0")
        check_shape(rank, world_size)
        for name, cap in (("max_images", max_images), ("max_frames", max_frames)):
            if cap is not None and cap < 0:
                raise UsageError(f"MediaDataset: {name} must not be negative, got {cap}")
        directory = None if cache_dir is None else checks.path("cache_dir", cache_dir)
        # the shard table once per node; frames are read while their shards are fetched whole
        self.replicas = Replicas(url, storage_options, cache_dir=directory, share_fills=True)
        # under torch.distributed every rank reads the version rank 0 read (client.agree), as TokenDataset does
        self.manifest: Manifest = agreed_manifest(self.replicas.load_manifest, self.replicas.names, version)
        self.policy = self.manifest.media  # None: a dataset without media
        remote = not all(self.replicas.local(i) for i in range(len(self.replicas.urls)))
        self.cache = None
        if directory is not None and remote:
            limit = checks.size("cache_limit", cache_limit)
            self.cache = ShardCache(directory, limit, self.replicas, dtype=self.manifest.token_dtype)
        self.seq_len, self.seed, self.shuffle = seq_len, seed, shuffle
        self.max_images, self.max_frames, self.open_bins = max_images, max_frames, open_bins
        eos = self.manifest.tokenizer.eos_id
        self.pad_id = pad_id if pad_id is not None else (eos if eos is not None else 0)
        self.decode = decode
        self.rank, self.world_size, self.epochs = rank, world_size, epochs
        self.start = 0
        self.epochs_index = EpochIndex(self.sequences)
        self._pid = -1
        self._cached: CachedShards | None = None  # this process's view of the disk cache
        self._reader: MediaReader | None = None
        self._pieces: Pieces | None = None
        self._known: dict[int, ShardMedia] = {}  # every shard's metadata once pieces() has read it
        self._doc_first = np.zeros(0, dtype=np.int64)
        self._plans: dict[int, Plan] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Without the reader (open handles, locks): each process makes its own (DataLoader workers, spawn)."""
        state = dict(self.__dict__)
        state["_reader"], state["_pid"], state["_cached"] = None, -1, None
        return state

    # -- state -------------------------------------------------------------------------------------------------

    def fingerprint(self) -> list[Any]:
        caps = [self.max_images, self.max_frames, self.open_bins, self.shuffle]
        return [self.manifest.version_id, self.seq_len, self.seed, *caps]

    def anchors(self, position: int) -> list[list[int]]:
        return [list(self.epochs_index.anchor(position))]

    def adopt(self, anchors: Any, position: int) -> None:
        if not isinstance(anchors, list) or len(anchors) != 1:
            raise StateError(f"a media dataset's state has one anchor [epoch, first position], got {anchors!r}")
        self.epochs_index.adopt(anchors[0], position)

    def ended(self, position: int) -> bool:
        return self.epochs is not None and self.epochs_index.locate(position)[0] >= self.epochs

    def end(self) -> int | None:
        """The position where the epochs to read end (None: no end); plans every epoch before it."""
        return None if self.epochs is None else self.epochs_index.first(self.epochs)

    def warm(self) -> None:
        self.plan(self.epochs_index.locate(self.start)[0])

    # -- planning ----------------------------------------------------------------------------------------------

    def _new_reader(self) -> MediaReader:
        whole = None if self._cached is None else self._cached.cache.present
        frames = frame_reader_for(self.manifest, self.replicas, _FRAME_BUDGET, whole)
        return MediaReader(self.manifest, self.replicas, frames, self._known, self._cached)

    def reader(self) -> MediaReader:
        """This process's reader (made anew in each DataLoader worker, from the shards' metadata already read)."""
        if self._reader is None or self._pid != os.getpid():
            self._cached = None if self.cache is None else CachedShards(self.cache)
            self._reader, self._pid = self._new_reader(), os.getpid()
        return self._reader

    def settle(self) -> None:
        if self._reader is not None and self._pid == os.getpid() and self._cached is not None:
            self._cached.settle()

    def pieces(self) -> Pieces:
        """Every document's pieces (from each shard's metadata: no media bytes)."""
        if self._pieces is not None:
            return self._pieces
        reader = self.reader()
        local = all(self.replicas.local(i) for i in range(len(self.replicas.urls)))
        shards = reader.load(range(len(self.manifest.shards)), self._new_reader, 1 if local else _META_THREADS)
        self._known = dict(enumerate(shards))
        lengths, span_doc, span_start, span_cost, span_img, span_frames = [], [], [], [], [], []
        first = 0
        self._doc_first = np.zeros(len(self.manifest.shards) + 1, dtype=np.int64)
        for s, sm in enumerate(shards):
            meta = sm.meta
            lengths.append(np.diff(sm.offsets))
            per_doc = np.diff(meta.doc_offsets)
            span_doc.append(first + np.repeat(np.arange(len(per_doc)), per_doc))
            span_start.append(meta.position)
            span_cost.append(meta.cost)
            span_img.append(np.asarray([k == "image" for k in meta.kind], dtype=np.int64))
            span_frames.append(np.where(np.asarray(meta.kind) == "video", meta.frames, 0).astype(np.int64))
            first += len(per_doc)
            self._doc_first[s + 1] = first

        def joined(parts: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

        self._pieces = cut_pieces(
            joined(lengths),
            joined(span_doc),
            joined(span_start),
            joined(span_cost),
            joined(span_img),
            joined(span_frames),
            self.seq_len,
        )
        return self._pieces

    def plan(self, epoch: int) -> Plan:
        """The sequences of ``epoch`` (all ranks'); the last two epochs' plans are kept."""
        plan = self._plans.get(epoch)
        if plan is None:
            plan = plan_epoch(
                self.pieces(),
                self.seq_len,
                self.seed,
                epoch,
                max_images=self.max_images,
                max_frames=self.max_frames,
                open_bins=self.open_bins,
                shuffle=self.shuffle,
            )
            self._plans = {e: p for e, p in self._plans.items() if e == epoch - 1}
            self._plans[epoch] = plan
        return plan

    def sequences(self, epoch: int) -> int:
        """How many sequences ``epoch`` has (over all ranks)."""
        return len(self.plan(epoch))

    # -- reading -----------------------------------------------------------------------------------------------

    def sample_at(self, position: int) -> dict[str, Any]:
        return self.sample(*self.epochs_index.locate(position))

    def prefetch_at(self, positions: Iterable[int]) -> None:
        self.prefetch([self.epochs_index.locate(int(p)) for p in positions])

    def trace_at(self, position: int) -> dict[str, Any]:
        from .trace import dataset_record

        return dataset_record(self, position)

    def located(self, epoch: int, index: int) -> list[tuple[int, int, int, int, int]]:
        """``(document, shard, document in the shard, start, stop)`` of each piece of sequence ``index``."""
        plan, pieces = self.plan(epoch), self.pieces()
        if not 0 <= index < len(plan):
            raise UsageError(f"epoch {epoch} has {len(plan)} sequences, not one numbered {index}")
        out = []
        for p in plan.pieces(index).tolist():
            d, a, b = int(pieces.doc[p]), int(pieces.start[p]), int(pieces.stop[p])
            s = int(np.searchsorted(self._doc_first, d, side="right")) - 1
            out.append((d, s, d - int(self._doc_first[s]), a, b))
        return out

    @staticmethod
    def items_in(sm: ShardMedia, local: int, a: int, b: int) -> tuple[int, int]:
        """The items ``[j0, j1)`` of a shard whose spans start in tokens ``[a, b)`` of its document ``local``."""
        j0, j1 = int(sm.meta.doc_offsets[local]), int(sm.meta.doc_offsets[local + 1])
        pos = sm.meta.position[j0:j1]
        inside = np.flatnonzero((pos >= a) & (pos < b))
        return (j0 + int(inside[0]), j0 + int(inside[-1]) + 1) if len(inside) else (j0, j0)

    def prefetch(self, positions: Sequence[tuple[int, int]]) -> None:
        """Fetch together the tokens' and media's frames of the sequences at ``(epoch, index)`` positions (from
        remote replicas their round trips overlap; a no-op for local files)."""
        reader = self.reader()
        if not reader.fetches_ahead:
            return
        spans = []
        for epoch, index in positions:
            for _d, s, local, a, b in self.located(epoch, index):
                sm = reader.shard(s)
                base = int(sm.offsets[local])
                spans.append((s, base + a, base + b, *self.items_in(sm, local, a, b)))
        reader.prefetch(spans)

    def sample(self, epoch: int, index: int) -> dict[str, Any]:
        """Sequence ``index`` of ``epoch``."""
        reader = self.reader()
        self.prefetch([(epoch, index)])
        L = self.seq_len
        ids = np.full(L, self.pad_id, dtype=np.int64)
        labels = np.full(L, IGNORE, dtype=np.int64)
        positions = np.zeros(L, dtype=np.int64)
        documents, spans, media = [], [], []
        t = 0
        for d, s, local, a, b in self.located(epoch, index):
            sm = reader.shard(s)
            base = int(sm.offsets[local])
            n = b - a
            ids[t : t + n] = reader.tokens(s, base + a, base + b)
            labels[t : t + n - 1] = ids[t + 1 : t + n]
            positions[t : t + n] = np.arange(a, b)
            documents.append((d, t, n, a))
            for item in reader.items(s, *self.items_in(sm, local, a, b)):
                spans.append((t + item.position - a, item.cost))
                media.append(self.decode(item) if self.decode is not None else item)
            t += n
        if self.policy is not None:
            labels[np.isin(labels, self.policy.ids)] = IGNORE
        return {
            "input_ids": ids,
            "labels": labels,
            "position_ids": positions,
            "documents": np.asarray(documents, dtype=np.int64).reshape(-1, 4),
            "media_spans": np.asarray(spans, dtype=np.int64).reshape(-1, 2),
            "media": media,
            "position": self.epochs_index.first(epoch) + index,
            "epoch": epoch,
            "index": index,
        }
