"""Reading samples of one dataset out of memory-mapped shards into preallocated batch arrays.

Keeps an LRU of open leases (mapped shards) per process, bounded by count and by the
cache limit in bytes. A token-mode sample is a slice of the stream ``[a, a + L + 1)``
copied straight from the mapped uint16/uint32 array into int64 rows (two pieces, or
more with tiny shards, when it crosses shard boundaries).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from shard_tools.format import ShardView
from shard_tools.manifest import Manifest

from .cache import Lease, ShardCache

__all__ = ["ShardReader"]

IGNORE_INDEX = -100


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
    ) -> None:
        self.manifest = manifest
        self.cache = cache
        self.populate = populate
        self.max_open = max_open
        self.max_bytes = cache.limit if max_bytes is None else max_bytes
        self.token_offsets = manifest.shards.token_offsets
        doc_offsets = np.zeros(len(manifest.shards) + 1, dtype=np.int64)
        np.cumsum(manifest.shards.documents, out=doc_offsets[1:])
        self.doc_offsets = doc_offsets
        self._leases: OrderedDict[int, Lease] = OrderedDict()
        self._bytes = 0

    def close(self) -> None:
        for lease in self._leases.values():
            lease.release()
        self._leases.clear()
        self._bytes = 0

    def view(self, s: int) -> ShardView:
        """Shard ``s`` mapped (opened through the cache on first use in this process)."""
        lease = self._leases.get(s)
        if lease is not None:
            self._leases.move_to_end(s)
            return lease.view
        lease = self.cache.open(self.manifest.shards[s], populate=self.populate)
        self._leases[s] = lease
        self._bytes += lease.nbytes
        while len(self._leases) > 1 and (len(self._leases) > self.max_open or self._bytes > self.max_bytes):
            _, old = self._leases.popitem(last=False)
            self._bytes -= old.nbytes
            old.release()
        return lease.view

    def shard_of_token(self, starts: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.token_offsets, starts, side="right") - 1

    def shard_of_document(self, docs: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.doc_offsets, docs, side="right") - 1

    def gather_windows(self, starts: np.ndarray, length: int, raw: np.ndarray, rows: np.ndarray) -> None:
        """Row ``rows[i]`` of ``raw`` (token dtype, ``length + 1`` wide) ← stream ``[starts[i], starts[i]+length+1)``.

        Copying the narrow token ids first and widening the whole batch to int64 afterwards in two
        vectorised casts is several times faster than widening row by row.
        """
        shards = self.shard_of_token(starts)
        locals_ = (starts - self.token_offsets[shards]).tolist()
        views: dict[int, np.ndarray] = {}
        width = length + 1
        for local, s, row in zip(locals_, shards.tolist(), rows.tolist(), strict=True):
            tokens = views.get(s)
            if tokens is None:
                tokens = views[s] = self.view(s).tokens
            if local + width <= tokens.shape[0]:
                raw[row] = tokens[local : local + width]
                continue
            filled = 0  # crosses into the next shard(s)
            while filled < width:
                tokens = self.view(s).tokens
                take = min(width - filled, tokens.shape[0] - local)
                raw[row, filled : filled + take] = tokens[local : local + take]
                filled += take
                s, local = s + 1, 0

    def boundaries(self, start: int, length: int) -> list[int]:
        """Offsets in ``(0, length)`` where a document starts inside the sample beginning at stream ``start``."""
        out: list[int] = []
        end = start + length
        s = int(self.shard_of_token(np.asarray([start]))[0])
        while s < len(self.token_offsets) - 1 and int(self.token_offsets[s]) < end:
            doc_starts = self.view(s).offsets[:-1] + int(self.token_offsets[s])
            i = int(np.searchsorted(doc_starts, start, side="right"))
            j = int(np.searchsorted(doc_starts, end, side="left"))
            out.extend((doc_starts[i:j] - start).tolist())
            s += 1
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
        for d, s, row in zip(docs.tolist(), shards.tolist(), rows.tolist(), strict=True):
            view = self.view(s)
            local = d - int(self.doc_offsets[s])
            a, b = int(view.offsets[local]), int(view.offsets[local + 1])
            t = view.tokens[a : min(b, a + length + 1)]
            n = max(0, t.shape[0] - 1)
            inputs[row, :n] = t[:-1] if n else t[:0]
            labels[row, :n] = t[1:]
            inputs[row, n:] = pad_id
            labels[row, n:] = IGNORE_INDEX
            mask[row, :n] = 1
            mask[row, n:] = 0
