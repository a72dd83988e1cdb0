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

from dataclasses import dataclass

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
    room = np.zeros(0, dtype=np.int64)
    imgs = np.zeros(0, dtype=np.int64)
    frs = np.zeros(0, dtype=np.int64)
    members: list[list[int]] = []
    closed: list[list[int]] = []
    for p in order.tolist():
        length, im, fr = int(lengths[p]), int(images[p]), int(frames[p])
        fits = (room >= length) & (imgs + im <= img_cap) & (frs + fr <= fr_cap)
        if fits.any():
            b = int(np.flatnonzero(fits)[np.argmin(room[fits])])
        else:
            room, imgs, frs = np.append(room, seq_len), np.append(imgs, 0), np.append(frs, 0)
            members.append([])
            b = len(members) - 1
        room[b] -= length
        imgs[b] += im
        frs[b] += fr
        members[b].append(p)
        if len(members) > open_bins or room[b] == 0:  # close the fullest (a full one at once)
            c = b if room[b] == 0 else int(np.argmin(room))
            closed.append(members.pop(c))
            room, imgs, frs = np.delete(room, c), np.delete(imgs, c), np.delete(frs, c)
    closed.extend(members)
    bounds = np.zeros(len(closed) + 1, dtype=np.int64)
    np.cumsum([len(m) for m in closed], out=bounds[1:])
    flat = np.asarray([p for m in closed for p in m], dtype=np.int64)
    return Plan(flat, bounds)
