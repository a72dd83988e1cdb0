"""Packing documents with media into fixed-length sequences: a pure plan from lengths, spans and a seed.

Each document (its tokens, EOS included) is cut into *pieces* of at most ``seq_len`` tokens, never inside
a media item's placeholder span (a span longer than ``seq_len`` cannot be placed: a ``UsageError``). An
epoch shuffles the pieces by ``(seed, epoch)`` and packs them best-fit into sequences: up to ``open_bins``
sequences are open at once; each piece goes into the open sequence with the least room that still holds
it and stays within the caps (images, video frames per sequence), else into a new one; when more than
``open_bins`` are open, the fullest is closed. Sequences are numbered in the order they close. The plan is
a function of its inputs alone, so sequence ``k`` of an epoch is the same in every run and resuming at
``k`` continues exactly where a run stopped.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from ferry.shard_tools.errors import UsageError

__all__ = ["Pieces", "cut_pieces", "plan_epoch", "Plan"]


@dataclass(frozen=True)
class Pieces:
    """Pieces of documents: piece ``p`` is tokens ``[start[p], stop[p])`` of document ``doc[p]`` and holds
    ``images[p]`` images and ``frames[p]`` video frames."""

    doc: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    images: np.ndarray
    frames: np.ndarray

    @property
    def lengths(self) -> np.ndarray:
        return self.stop - self.start

    def __len__(self) -> int:
        return len(self.doc)


def cut_pieces(
    doc_lengths: np.ndarray,
    span_doc: np.ndarray,
    span_start: np.ndarray,
    span_cost: np.ndarray,
    span_images: np.ndarray,
    span_frames: np.ndarray,
    seq_len: int,
) -> Pieces:
    """Cut documents into pieces of at most ``seq_len`` tokens, no piece boundary inside a media span.

    ``span_*`` describe every media item (document, start in it, cost, 1 if an image, video frames), sorted by
    document then start."""
    too_long = np.flatnonzero(span_cost > seq_len)
    if len(too_long):
        j = int(too_long[0])
        raise UsageError(
            f"a media item of document {int(span_doc[j])} takes {int(span_cost[j])} tokens, more than seq_len "
            f"{seq_len}: raise seq_len or pack with a policy of fewer tokens per item"
        )
    docs, starts, stops = [], [], []
    long_docs = np.flatnonzero(doc_lengths > seq_len)
    spans_of = np.searchsorted(span_doc, np.arange(len(doc_lengths) + 1))
    short = np.ones(len(doc_lengths), dtype=bool)
    short[long_docs] = False
    for d in long_docs.tolist():
        lo, hi = int(spans_of[d]), int(spans_of[d + 1])
        s_start, s_end = span_start[lo:hi], span_start[lo:hi] + span_cost[lo:hi]
        a, n = 0, int(doc_lengths[d])
        while a < n:
            b = min(a + seq_len, n)
            inside = np.flatnonzero((s_start < b) & (s_end > b))  # a span the cut would split
            if len(inside):
                b = int(s_start[inside[0]])
            docs.append(d)
            starts.append(a)
            stops.append(b)
            a = b
    all_docs = np.concatenate([np.flatnonzero(short), np.asarray(docs, dtype=np.int64)])
    all_starts = np.concatenate([np.zeros(int(short.sum()), dtype=np.int64), np.asarray(starts, dtype=np.int64)])
    all_stops = np.concatenate([doc_lengths[short].astype(np.int64), np.asarray(stops, dtype=np.int64)])
    order = np.lexsort((all_starts, all_docs))
    doc, start, stop = all_docs[order], all_starts[order], all_stops[order]
    images, frames = _per_piece(doc, start, span_doc, span_start, span_images, span_frames)
    return Pieces(doc, start, stop, images, frames)


def _per_piece(
    doc: np.ndarray, start: np.ndarray, span_doc: np.ndarray, span_start: np.ndarray, img: np.ndarray, fr: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Images and frames of each piece (a span belongs to the piece its start falls in)."""
    if len(span_doc) == 0:
        return np.zeros(len(doc), dtype=np.int64), np.zeros(len(doc), dtype=np.int64)
    # piece of each span: the last piece (sorted by doc, start) with (doc, start) <= (span_doc, span_start)
    key_pieces = doc * (1 << 32) + start
    key_spans = span_doc.astype(np.int64) * (1 << 32) + span_start
    which = np.searchsorted(key_pieces, key_spans, side="right") - 1
    images = np.bincount(which, weights=img, minlength=len(doc)).astype(np.int64)
    frames = np.bincount(which, weights=fr, minlength=len(doc)).astype(np.int64)
    return images, frames


@dataclass(frozen=True)
class Plan:
    """An epoch's sequences: sequence ``k`` is pieces ``order[bounds[k]:bounds[k + 1]]`` in that order."""

    order: np.ndarray
    bounds: np.ndarray

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def pieces(self, k: int) -> np.ndarray:
        return self.order[self.bounds[k] : self.bounds[k + 1]]


@dataclass
class _Bin:
    room: int
    images: int = 0
    frames: int = 0
    members: list[int] = field(default_factory=list)


def _best_fit(
    order: list[int],
    lengths: list[int],
    images: list[int],
    frames: list[int],
    seq_len: int,
    caps: tuple[int, int],
    open_bins: int,
) -> list[list[int]]:
    """The pieces of each sequence, in the order the sequences close. Open sequences are kept sorted by
    ``(room, number)``: the first with room for a piece that keeps within the caps takes it."""
    rooms: list[tuple[int, int]] = []
    bins: dict[int, _Bin] = {}
    closed: list[list[int]] = []
    made = 0
    for p in order:
        length, im, fr = lengths[p], images[p], frames[p]
        i = bisect.bisect_left(rooms, (length, -1))
        while i < len(rooms):
            b = bins[rooms[i][1]]
            if b.images + im <= caps[0] and b.frames + fr <= caps[1]:
                break
            i += 1
        else:
            number, made = made, made + 1
            bins[number] = _Bin(seq_len)
            i = bisect.bisect_left(rooms, (seq_len, number))
            rooms.insert(i, (seq_len, number))
        _, number = rooms.pop(i)
        b = bins[number]
        b.room, b.images, b.frames = b.room - length, b.images + im, b.frames + fr
        b.members.append(p)
        if b.room == 0:  # full: closed at once
            closed.append(bins.pop(number).members)
        else:
            bisect.insort(rooms, (b.room, number))
        if len(rooms) > open_bins:  # too many open: close the fullest
            closed.append(bins.pop(rooms.pop(0)[1]).members)
    closed.extend(bins[number].members for number in sorted(bins))
    return closed


def plan_epoch(
    pieces: Pieces,
    seq_len: int,
    seed: int,
    epoch: int,
    *,
    max_images: int | None = None,
    max_frames: int | None = None,
    open_bins: int = 64,
    shuffle: bool = True,
) -> Plan:
    """The sequences of one epoch (see the module docstring)."""
    n = len(pieces)
    order = np.random.Generator(np.random.PCG64([seed, epoch])).permutation(n) if shuffle else np.arange(n)
    lengths, images, frames = pieces.lengths, pieces.images, pieces.frames
    img_cap = np.iinfo(np.int64).max if max_images is None else max_images
    fr_cap = np.iinfo(np.int64).max if max_frames is None else max_frames
    for cap, used, what in ((img_cap, images, "images"), (fr_cap, frames, "video frames")):
        if len(used) and int(used.max()) > cap:
            raise UsageError(f"a piece of a document holds {int(used.max())} {what}, more than the cap of {cap}")
    closed = _best_fit(order.tolist(), lengths.tolist(), images.tolist(), frames.tolist(), seq_len,
                       (img_cap, fr_cap), open_bins)  # fmt: skip
    bounds = np.zeros(len(closed) + 1, dtype=np.int64)
    np.cumsum([len(m) for m in closed], out=bounds[1:])
    flat = np.asarray([p for m in closed for p in m], dtype=np.int64)
    return Plan(flat, bounds)
