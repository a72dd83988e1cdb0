"""Provenance of packed sequences with media (``MediaLoader.trace``): what each sequence was made of.

For stream positions: in a mixture the source and its own stream position, then the dataset (URL as shown,
version), the epoch and the sequence's number in it, and for each document piece the shard, the global and
in-shard document index, its token range in the document and where it starts in the sequence, and each media
item it carries: the item's number in the shard, kind, format, size, cost, its placeholder span in the sequence,
its bytes' range in the shard's media data (``data_bytes``) and, for shards read by frames, in the shard's Arrow
bytes (``shard_bytes``: the range a ranged read fetches). Only shard metadata is read, no media bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ferry.shard_tools.errors import UsageError

from .source import POSITION_LIMIT, MediaSource

if TYPE_CHECKING:
    from .dataset import MediaDataset
    from .reader import ShardMedia

__all__ = ["trace_media", "dataset_record"]


def trace_media(source: MediaSource, positions: Sequence[int]) -> list[dict[str, Any]]:
    """One record per stream position of ``source`` (a MediaDataset or MediaMixture)."""
    if isinstance(positions, (str, bytes)) or not isinstance(positions, Sequence):
        raise UsageError(f"positions must be a list of integers, got {positions!r}")
    for p in positions:
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < POSITION_LIMIT:
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
