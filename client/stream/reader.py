"""Reading samples of one dataset out of memory-mapped shards (or frames) into preallocated batch arrays.

Keeps an LRU of open leases (mapped shards) per process, bounded by count and by the
cache limit in bytes. A token-mode sample is a slice of the stream ``[a, a + L + 1)``
copied straight from the mapped uint16/uint32 array into int64 rows (two pieces, or
more with tiny shards, when it crosses shard boundaries).

A format-3 shard (seekable, every frame bound to its raw digest) that is not mapped in this process is
read by frames (:class:`ferry.client.fetching.frames.FrameReader`) instead of whole when ``whole_shards`` is off (a
global shuffle over more than the cache: whole shards would be fetched for a sample each) or, with
``background`` fetching, while the shard is not in the node cache yet (a cold start: the first
batch needs only the frames its samples touch while a helper thread brings the whole shard) and the shard
holds more than ``FRAMES_FIRST_MIN`` frames (a smaller one is fetched whole at once: its frames would save
little time and could double the bytes read). Shards of formats 1 and 2 are always read whole (a format-2
frame cannot be checked against its flat raw digest).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any, cast

import numpy as np

from ferry.shard_tools.errors import FerryError, ShardError, StorageError
from ferry.shard_tools.format.manifest import Manifest, ShardInfo
from ferry.shard_tools.format.shard import ShardView

from ..fetching.cache import Lease, ShardCache
from ..fetching.frames import FrameReader
from ..fetching.prefetcher import Prefetcher
from ..sampling.shards import sample_reads
from .blocks import BatchReads

__all__ = ["ShardReader"]

IGNORE_INDEX = -100
# At most this many frames: a cold shard is fetched whole at once, not by frames first (1 MiB shards read
# with a window shuffle cost 1.88x their stored bytes by frames first, 1.0x whole).
FRAMES_FIRST_MIN = 4
log = logging.getLogger(__name__)


class ShardReader:
    """Mapped shards of one dataset version, and the gathers that read samples from them."""

    def __init__(
        self,
        manifest: Manifest,
        cache: ShardCache,
        *,
        max_open: int = 64,
        max_bytes: int | None = None,
        populate: bool = False,
        frames: FrameReader | None = None,
        whole_shards: bool = True,
        prefetcher: Prefetcher | None = None,
        wait_for_started: bool = False,
        head_tokens: int = 0,
    ) -> None:
        self.manifest = manifest
        # tokens of each mapped shard kept as its head in the node cache (0: none): a sample's width
        self.head_tokens = head_tokens
        self._heads_kept: set[int] = set()
        self.cache = cache
        self.populate = populate
        self.frames = frames
        self.whole_shards = whole_shards
        # the background fetches of this process (None: none); a shard read by frames is fetched whole meanwhile
        self.prefetcher = prefetcher
        # window / in-order reads: once a shard's whole fetch has started, later batches wait for it instead of
        # reading frames, which cost far more bytes per sample and slow that very fetch
        self.wait_for_started = wait_for_started
        self._no_frames: set[int] = set()  # shards whose frames failed here: read whole (with replica fallback)
        self.dtype = np.dtype(manifest.token_dtype)
        shards = manifest.shards
        self._seekable = shards.frame_size > 0  # format 3: frames checkable against the raw digest
        # format 3 and more than FRAMES_FIRST_MIN frames: a cold shard fetched whole anyway is read by frames first
        self._frames_first = self._seekable & (shards.raw_bytes > FRAMES_FIRST_MIN * shards.frame_size)
        self._sizes = manifest.shards.tokens
        self._size_list: list[int] = self._sizes.tolist()  # per-sample bounds checks on Python ints, not numpy scalars
        self._infos: dict[int, ShardInfo] = {}
        self.max_open = max_open
        self.max_bytes = cache.limit if max_bytes is None else max_bytes
        self.token_offsets = manifest.shards.token_offsets
        doc_offsets = np.zeros(len(manifest.shards) + 1, dtype=np.int64)
        np.cumsum(manifest.shards.documents, out=doc_offsets[1:])
        self.doc_offsets = doc_offsets
        self._leases: OrderedDict[int, Lease] = OrderedDict()
        self._bytes = 0

    @property
    def background(self) -> bool:
        """Whether shards are fetched whole in the background (then a cold format-3 shard is read by frames
        meanwhile)."""
        return self.prefetcher is not None

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.settle()
        if self.frames is not None:
            self.frames.close()
        for lease in self._leases.values():
            lease.release()
        self._leases.clear()
        self._bytes = 0

    def view(self, s: int) -> ShardView:
        """Shard ``s`` mapped (opened through the cache on first use in this process)."""
        view = self._mapped_view(s)
        if view is not None:
            return view
        lease = self.cache.open(self.manifest.shards[s], populate=self.populate)
        self._leases[s] = lease
        if self.head_tokens and s not in self._heads_kept:
            self._heads_kept.add(s)
            self.cache.keep_head(self.info(s), lease.view.tokens[: self.head_tokens].tobytes())
        self._bytes += lease.nbytes
        while len(self._leases) > 1 and (len(self._leases) > self.max_open or self._bytes > self.max_bytes):
            _, old = self._leases.popitem(last=False)
            self._bytes -= old.nbytes
            old.release()
        return lease.view

    @property
    def mapped_bytes(self) -> int:
        """Raw bytes of the shards this process has mapped now."""
        return self._bytes

    @property
    def mapped_count(self) -> int:
        """How many shards this process has mapped now."""
        return len(self._leases)

    def mapped(self, s: int) -> bool:
        return s in self._leases

    def mapped_shards(self) -> set[int]:
        return set(self._leases)

    def info(self, s: int) -> ShardInfo:
        info = self._infos.get(s)
        if info is None:
            if len(self._infos) >= 4096:
                self._infos.clear()
            info = self._infos[s] = self.manifest.shards[s]
        return info

    def by_frames(self, s: int) -> bool:
        """Whether shard ``s`` is read by frames now: format 3, not mapped here, and whole shards not wanted
        or this one not in the node cache yet."""
        if self.frames is None or not self._seekable[s] or s in self._leases or s in self._no_frames:
            return False
        if not self.whole_shards:
            return True
        if not self._frames_first[s] or self.prefetcher is None:
            return False  # nothing would ever bring the whole shard: fetch it now, as format 1
        self.cache.raise_deferred()  # a full disk is the job's to see, not only a slower run
        info = self.info(s)
        try:
            if self.cache.present(info):
                return False
        except OSError:
            return False  # the cache directory itself is unusable: the whole-shard path names it (CacheError)
        if self.wait_for_started and self.prefetcher.started(s):
            return False  # its whole fetch is under way: wait for it
        self._fetch_whole(s, info)
        return True

    def _fetch_whole(self, s: int, info: ShardInfo) -> None:
        """Bring shard ``s`` into the node cache in the background while it is read by frames: once the samples
        at hand are read, so as not to compete with them, on the prefetcher's thread for shards read now."""
        assert self.prefetcher is not None
        self.prefetcher.request(s, info, urgent=True, after_gather=True)

    def read_by_frames_first(self, s: int) -> bool:
        """Whether a cold read of shard ``s`` starts with frames (format 3 and a frame reader): then fetching it
        whole waits until the samples at hand are read (a whole fetch would compete with the frames a cold batch
        reads)."""
        return self.frames is not None and self.background and bool(self._frames_first[s])

    def _start_later(self) -> None:
        """The samples at hand are read: the whole fetches that waited for them start."""
        if self.prefetcher is not None:
            self.prefetcher.release()

    def head_by_frames(self, s: int) -> bool:
        """Whether the head of shard ``s`` that a sample of the shard before runs on into is read by frames
        (format 3, a frame reader, and ``s`` neither mapped here nor in the node cache): its whole fetch then
        waits for its own window, and a dataset larger than the cache is not downloaded twice."""
        if self.frames is None or not self._seekable[s] or s in self._leases or s in self._no_frames:
            return False
        if self.whole_shards and not self._frames_first[s]:
            return False  # fetched whole for its head: it is read whole anyway, and not much later
        try:
            return not self.cache.present(self.info(s))
        except OSError:
            return False

    def head_without_shard(self, s: int) -> bool:
        """Whether the head of shard ``s`` (what the sample of the shard before runs on into) is read without
        fetching ``s`` whole: by frames (:meth:`head_by_frames`), or from the head the node cache keeps."""
        if s in self._leases:
            return False
        if self.head_by_frames(s):
            return True
        return self.head_tokens > 0 and self.cache.has_head(self.info(s), self.head_tokens * self.dtype.itemsize)

    def _head(self, s: int, take: int, memo: dict[int, np.ndarray | None]) -> np.ndarray:
        """The first ``take`` tokens of shard ``s``, where a sample of the shard before runs on."""
        if s in memo or s in self._leases:
            return self._slice(s, 0, take, memo)
        if self.head_by_frames(s):
            return self._frame_tokens(s, 0, take, memo)
        if take <= self.head_tokens:
            head = self.cache.read_head(self.info(s), take * self.dtype.itemsize)
            if head is not None:
                return np.frombuffer(head, dtype=self.dtype)
        return self._slice(s, 0, take, memo)

    def frames_only(self, s: int) -> bool:
        """Whether shard ``s`` is never fetched whole here (format 3 and whole shards not wanted)."""
        return self.frames is not None and not self.whole_shards and bool(self._seekable[s])

    def _source(self, s: int, memo: dict[int, np.ndarray | None]) -> np.ndarray | None:
        """Shard ``s``'s mapped tokens, or None to read it by frames (decided once per gather)."""
        if s not in memo:
            memo[s] = None if self.by_frames(s) else self.view(s).tokens
        return memo[s]

    def _mapped_tokens(self, shard_list: list[int]) -> dict[int, np.ndarray] | None:
        """The tokens of the batch's shards when every one is mapped here (the steady state: what ``_source`` would
        decide for each, without asking), else None."""
        memo: dict[int, np.ndarray] = {}
        leases = self._leases
        for s in shard_list:
            if s not in memo:
                lease = leases.get(s)  # inlined _mapped_view: this runs for every batch
                if lease is None:
                    return None
                leases.move_to_end(s)
                memo[s] = lease.view.tokens
        return memo

    def _mapped_view(self, s: int) -> ShardView | None:
        """Shard ``s``'s view if this process has it mapped (made the most recently used), else None."""
        lease = self._leases.get(s)
        if lease is None:
            return None
        self._leases.move_to_end(s)
        return lease.view

    def _slice(self, s: int, a: int, b: int, memo: dict[int, np.ndarray | None]) -> np.ndarray:
        tokens = self._source(s, memo)
        if tokens is not None:
            return tokens[a:b]
        return self._frame_tokens(s, a, b, memo)

    def _frame_tokens(self, s: int, a: int, b: int, memo: dict[int, np.ndarray | None]) -> np.ndarray:
        """Tokens ``[a, b)`` of shard ``s`` by frames; the shard mapped whole instead when a frame fails."""
        assert self.frames is not None
        try:
            return self.frames.tokens(self.info(s), self.dtype, a, b)
        except (ShardError, StorageError) as exc:
            memo[s] = self._whole_instead(s, exc).tokens
            return self._slice(s, a, b, memo)

    def _whole_instead(self, s: int, exc: FerryError) -> ShardView:
        """Shard ``s`` mapped whole after a frame of it failed (a bad or missing copy where frames come from):
        the cache fetches it verified, from the first replica with a good copy, or raises naming them all."""
        log.warning("%s; reading shard %d whole from the replicas instead of by frames", exc, s)
        self._no_frames.add(s)
        return self.view(s)

    def _doc_offsets(self, s: int, memo: dict[int, np.ndarray | None]) -> np.ndarray:
        """All document offsets of shard ``s`` (mapped, or by frames)."""
        if self._source(s, memo) is not None:
            return self.view(s).offsets
        assert self.frames is not None
        info = self.info(s)
        try:
            return self.frames.offsets(info, 0, info.documents)
        except (ShardError, StorageError) as exc:
            memo[s] = self._whole_instead(s, exc).tokens
            return self.view(s).offsets

    def _prefetch_frames(self, shards: list[int], locals_: list[int], width: int, memo: dict[int, Any]) -> None:
        """Fetch the frames of a batch's samples together (the parts of samples that run into a next shard are
        left to the sequential read)."""
        assert self.frames is not None
        items = [
            (self.info(s), local, min(local + width, int(self._sizes[s])))
            for local, s in zip(locals_, shards, strict=True)
            if self._source(s, memo) is None
        ]
        if items:
            self.frames.prefetch_tokens(items, self.dtype)

    def _doc_span(self, s: int, local: int, memo: dict[int, np.ndarray | None]) -> tuple[int, int]:
        """Document ``local`` of shard ``s`` (read by frames) as a token range of the shard."""
        assert self.frames is not None
        try:
            a, b = self.frames.offsets(self.info(s), local, local + 1).tolist()
            return int(a), int(b)
        except (ShardError, StorageError) as exc:
            view = self._whole_instead(s, exc)
            memo[s] = view.tokens
            return int(view.offsets[local]), int(view.offsets[local + 1])

    def shard_of_token(self, starts: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.token_offsets, starts, side="right") - 1

    def shard_of_document(self, docs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.doc_offsets, docs, side="right") - 1

    def gather_windows(self, starts: np.ndarray, length: int, raw: np.ndarray, rows: np.ndarray) -> None:
        """Row ``rows[i]`` of ``raw`` (token dtype, ``length + 1`` wide) ← stream ``[starts[i], starts[i]+length+1)``.

        Copying the narrow token ids first and widening the whole batch to int64 afterwards in two
        vectorised casts is several times faster than widening row by row.
        """
        shards, locals_, _ = sample_reads(starts, self.token_offsets, length + 1)
        shard_list = shards.tolist()
        self._gather(shard_list, locals_.tolist(), length + 1, raw, rows.tolist(), self._mapped_tokens(shard_list))

    def gather_reads(self, reads: BatchReads, raw: np.ndarray) -> None:
        """Row ``i`` of ``raw`` (token dtype) ← the ``raw.shape[1]`` tokens from sample ``i``'s planned read."""
        width = raw.shape[1]
        mapped = self._mapped_tokens(reads.shards)
        if mapped is not None and not reads.runs_on:  # the steady state: every shard mapped, no sample runs on
            for row, (s, local) in enumerate(zip(reads.shards, reads.offsets, strict=True)):
                raw[row] = mapped[s][local : local + width]
            self._start_later()
            return
        self._gather(reads.shards, reads.offsets, width, raw, range(len(reads.shards)), mapped)

    def _gather(
        self,
        shard_list: list[int],
        locals_: list[int],
        width: int,
        raw: np.ndarray,
        rows: Iterable[int],
        mapped: dict[int, np.ndarray] | None,
    ) -> None:
        """Row ``rows[i]`` of ``raw`` ← ``width`` tokens from offset ``locals_[i]`` of shard ``shard_list[i]`` on
        (``mapped``: :meth:`_mapped_tokens` of ``shard_list``, None when some of them are not mapped)."""
        if mapped is not None:
            memo = cast(dict[int, np.ndarray | None], mapped)
        else:
            memo = {}
            # each shard of the batch decided once, in read order; frames fetched together where some are read so
            by_frames = self.frames is not None and [
                s for s in dict.fromkeys(shard_list) if self._source(s, memo) is None
            ]
            if by_frames and len(shard_list) > 1:
                self._prefetch_frames(shard_list, locals_, width, memo)
        sizes = self._size_list
        for local, s, row in zip(locals_, shard_list, rows, strict=True):
            end = local + width
            if end <= sizes[s]:
                tokens = memo[s] if s in memo else self._source(s, memo)  # per sample: kept cheap
                raw[row] = tokens[local:end] if tokens is not None else self._slice(s, local, end, memo)
                continue
            filled = 0  # crosses into the next shard(s)
            while filled < width:
                take = min(width - filled, sizes[s] - local)
                part = self._slice(s, local, local + take, memo) if filled == 0 else self._head(s, take, memo)
                raw[row, filled : filled + take] = part
                filled += take
                s, local = s + 1, 0
        self._start_later()

    def boundaries(self, start: int, length: int) -> list[int]:
        """Offsets in ``(0, length)`` where a document starts inside the sample beginning at stream ``start``."""
        out: list[int] = []
        end = start + length
        s = int(self.shard_of_token(np.asarray([start]))[0])
        memo: dict[int, np.ndarray | None] = {}
        while s < len(self.token_offsets) - 1 and int(self.token_offsets[s]) < end:
            doc_starts = self._doc_offsets(s, memo)[:-1] + int(self.token_offsets[s])
            i = int(np.searchsorted(doc_starts, start, side="right"))
            j = int(np.searchsorted(doc_starts, end, side="left"))
            out.extend((doc_starts[i:j] - start).tolist())
            s += 1
        self._start_later()
        return out

    def gather_documents(
        self,
        docs: np.ndarray,
        length: int,
        pad_id: int,
        inputs: np.ndarray,
        labels: np.ndarray,
        mask: np.ndarray,
        rows: np.ndarray,
    ) -> None:
        """Row ``rows[i]`` ← document ``docs[i]`` (with its EOS) truncated to ``length + 1`` tokens, padded."""
        shards = self.shard_of_document(docs)
        memo: dict[int, np.ndarray | None] = {}
        for d, s, row in zip(docs.tolist(), shards.tolist(), rows.tolist(), strict=True):
            local = d - int(self.doc_offsets[s])
            if self._source(s, memo) is not None:
                view = self.view(s)
                a, b = int(view.offsets[local]), int(view.offsets[local + 1])
            else:
                a, b = self._doc_span(s, local, memo)
            t = self._slice(s, a, min(b, a + length + 1), memo)
            n = max(0, t.shape[0] - 1)
            inputs[row, :n] = t[:-1] if n else t[:0]
            labels[row, :n] = t[1:]
            inputs[row, n:] = pad_id
            labels[row, n:] = IGNORE_INDEX
            mask[row, :n] = 1
            mask[row, n:] = 0
        self._start_later()
