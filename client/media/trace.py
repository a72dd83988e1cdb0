"""Provenance of packed sequences with media (``MediaLoader.trace``): what each sequence was made of.

For stream positions: in a mixture the source and its own stream position, then the dataset (URL as shown,
version), the epoch and the sequence's number in it, and for each document piece the shard, the global and
in-shard document index, its token range in the document and where it starts in the sequence, and each media
item it carries: the item's number in the shard, kind, format, size, cost, its placeholder span in the sequence,
its bytes' range in the shard's media data (``data_bytes``) and, for shards read by frames, in the shard's Arrow
bytes (``shard_bytes``: the range a ranged read fetches). Only shard metadata is read, no media bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ferry.shard_tools.errors import UsageError

from .source import POSITION_LIMIT, MediaSource

if TYPE_CHECKING:
    from .dataset import MediaDataset
    from .reader import ShardMedia

__all__ = ["trace_media", "dataset_record"]


def trace_media(source: MediaSource, positions: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
    """One record per stream position of ``source`` (a MediaDataset or MediaMixture)."""
    if isinstance(positions, np.ndarray) and positions.ndim == 1:
        positions = positions.tolist()
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Sequence):
        raise UsageError(f"positions must be a list of integers, got {positions!r}")
    for p in positions:
        if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, np.integer)) or not 0 <= p < POSITION_LIMIT:
            raise UsageError(f"stream positions are integers in [0, 2**62), got {p!r}")
    return [source.trace_at(int(p)) for p in positions]


def dataset_record(ds: MediaDataset, position: int) -> dict[str, Any]:
    """The record of the sequence at ``position`` of ``ds``'s stream."""
    epoch, index = ds.epochs_index.locate(position)
    reader = ds.reader()
    documents = []
    t = 0
    for d, s, local, a, b in ds.located(epoch, index):
        sm = reader.shard(s)
        j0, j1 = ds.items_in(sm, local, a, b)
        documents.append({
            "shard": s,
            "path": reader.info(s).path,
            "document": d,
            "shard_document": local,
            "doc_tokens": [a, b],
            "start": t,
            "media": [_item(sm, j, t - a) for j in range(j0, j1)],
        })  # fmt: skip
        t += b - a
    return {
        "position": position,
        "url": ds.replicas.names[0],
        "dataset_version": ds.manifest.version_id,
        "epoch": epoch,
        "sequence": index,
        "documents": documents,
    }


def _item(sm: ShardMedia, j: int, shift: int) -> dict[str, Any]:
    """Item ``j`` of a shard, its span moved by ``shift`` (from the document's tokens to the sequence's)."""
    meta = sm.meta
    lo, hi = int(meta.data_offsets[j]), int(meta.data_offsets[j + 1])
    out: dict[str, Any] = {
        "item": j,
        "kind": meta.kind[j],
        "format": meta.format[j],
        "width": int(meta.width[j]),
        "height": int(meta.height[j]),
        "cost": int(meta.cost[j]),
        "span": [int(meta.position[j]) + shift, int(meta.cost[j])],
        "data_bytes": [lo, hi],
    }
    if sm.layout is not None:
        out["shard_bytes"] = [sm.layout.data_pos + lo, sm.layout.data_pos + hi]
    return out


# --- ferry trace --media ------------------------------------------------------------------------------------------


def source_for(urls: Sequence[str], state: Mapping[str, Any] | None, settings: Mapping[str, Any]) -> MediaSource:
    """The stream to trace: a media loader ``state``'s (its fingerprint fixes everything but the URLs, one per
    source), else ``urls`` read with ``settings`` (``seq_len``, ``seed``, ``max_images``, ``max_frames``,
    ``weights``), positioned at the state's position."""
    from .dataset import MediaDataset
    from .mixed import MediaMixture

    if not urls:
        raise UsageError("name the dataset(s) with --data URL (a media loader state does not record URLs)")
    if state is None:
        if settings.get("seq_len") is None or settings.get("seed") is None:
            raise UsageError("without --state, give --seq-len and --seed (and --max-images, --max-frames if set)")
        images, frames = settings.get("max_images"), settings.get("max_frames")
        sets = [
            MediaDataset(u, settings["seq_len"], seed=settings["seed"], max_images=images, max_frames=frames)
            for u in urls
        ]
        if len(sets) == 1:
            return sets[0]
        return MediaMixture(sets, settings.get("weights") or [1] * len(sets))
    fingerprint = state.get("fingerprint") if isinstance(state, Mapping) else None
    if not isinstance(fingerprint, list) or not fingerprint:
        raise UsageError("the state is no media loader state (no fingerprint list): drop --media or fix --state")
    mixture = fingerprint[0] == "mixture"
    prints = fingerprint[2] if mixture and len(fingerprint) == 3 else [fingerprint]
    if not isinstance(prints, list) or len(prints) != len(urls):
        raise UsageError(f"the state reads {len(prints) if isinstance(prints, list) else '?'} dataset(s), "
                         f"--data names {len(urls)}")  # fmt: skip
    sets = [_dataset_of(u, p) for u, p in zip(urls, prints, strict=True)]
    source: MediaSource = MediaMixture(sets, [tuple(p) for p in fingerprint[1]]) if mixture else sets[0]
    source.load_state_dict(state)
    return source


def _dataset_of(url: str, fingerprint: Any) -> MediaDataset:
    """The dataset a :meth:`MediaDataset.fingerprint` names, at ``url`` (the version it names)."""
    from .dataset import MediaDataset

    if not isinstance(fingerprint, list) or len(fingerprint) != 7:
        raise UsageError(f"the state's fingerprint {fingerprint!r} is no media dataset's")
    version, seq_len, seed, max_images, max_frames, open_bins, shuffle = fingerprint
    return MediaDataset(url, seq_len, seed=seed, shuffle=shuffle, max_images=max_images, max_frames=max_frames,
                        open_bins=open_bins, version=version)  # fmt: skip


def trace_lines(records: Sequence[Mapping[str, Any]]) -> list[str]:
    """``ferry trace --media``'s text: a line per sequence, per document piece and per media item."""
    lines = []
    for r in records:
        src = f"source {r['source']} position {r['source_position']} " if "source" in r else ""
        lines.append(f"global sequence {r['position']}: {src}{r['url']} version {r['dataset_version']} "
                     f"epoch {r['epoch']} sequence {r['sequence']}")  # fmt: skip
        for d in r["documents"]:
            a, b = d["doc_tokens"]
            lines.append(f"  shard {d['shard']} document {d['document']} tokens [{a}, {b}) at {d['start']}")
            for m in d["media"]:
                lo, hi = m["data_bytes"]
                lines.append(f"    item {m['item']} {m['kind']}/{m['format']} {m['width']}x{m['height']} "
                             f"span [{m['span'][0]}, +{m['span'][1]}) bytes [{lo}, {hi})")  # fmt: skip
    return lines
