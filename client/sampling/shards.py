"""Which shards a stream position reads: the samples each shard owns, and the shards of sample ids. Pure index math.

Shard ``s`` owns the samples whose first token (document mode: whose document) it holds: samples
``[first[s], first[s + 1])``. In token mode sample ``i`` is tokens ``[i*L, i*L + L + 1)``, so it may run
on into the shards after its owner. ``TokenDataset`` lays its samples out by :func:`first_samples`;
the daemon stages a job's shards in the order :func:`shards_of_samples` gives.
"""

from __future__ import annotations

import numpy as np

__all__ = ["first_reads", "first_samples", "sample_reads", "samples_of", "shards_of_samples"]


def samples_of(token_offsets: np.ndarray, documents: np.ndarray, seq_len: int, mode: str, shards: int) -> int:
    """Samples per epoch of the dataset made of its first ``shards`` shards."""
    if mode == "document":
        return int(np.asarray(documents)[:shards].sum())
    return max(0, (int(token_offsets[shards]) - 1) // seq_len)


def first_samples(
    token_offsets: np.ndarray, documents: np.ndarray, seq_len: int, mode: str, shards: int | None = None
) -> np.ndarray:
    """``first`` (``shards + 1`` entries) over the first ``shards`` shards (all by default): shard ``s`` owns
    samples ``[first[s], first[s + 1])``. ``token_offsets`` has one entry per shard and the total at the end."""
    count = len(token_offsets) - 1 if shards is None else shards
    if mode == "document":
        first = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(np.asarray(documents, dtype=np.int64)[:count], out=first[1:])
        return first
    first = -(-np.asarray(token_offsets, dtype=np.int64)[: count + 1] // seq_len)
    return np.minimum(first, samples_of(token_offsets, documents, seq_len, mode, count))


def shards_of_samples(
    ids: np.ndarray, first: np.ndarray, token_offsets: np.ndarray, seq_len: int, mode: str
) -> list[int]:
    """The shards samples ``ids`` read, in the order the ids first read them (each once): a sample's owner,
    then (token mode) the shards its last tokens run on into."""
    return first_reads(ids, first, token_offsets, seq_len, mode)[0]


def first_reads(
    ids: np.ndarray, first: np.ndarray, token_offsets: np.ndarray, seq_len: int, mode: str
) -> tuple[list[int], list[int]]:
    """:func:`shards_of_samples` and, per shard, the index into ``ids`` of the sample that reads it first."""
    ids = np.asarray(ids, dtype=np.int64)
    owner = np.searchsorted(first, ids, side="right") - 1
    out: dict[int, int] = {}
    if mode == "document":
        for i, a in enumerate(owner.tolist()):
            out.setdefault(a, i)
        return list(out), list(out.values())
    last_token = ids * seq_len + seq_len  # the label of the sample's last position
    last = np.minimum(np.searchsorted(token_offsets, last_token, side="right") - 1, len(token_offsets) - 2)
    for i, (a, b) in enumerate(zip(owner.tolist(), last.tolist(), strict=True)):
        for t in range(a, b + 1):
            out.setdefault(t, i)
    return list(out), list(out.values())


def sample_reads(
    starts: np.ndarray, token_offsets: np.ndarray, width: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where token-mode samples starting at stream tokens ``starts`` (``width`` tokens each) are read: per sample
    the shard that holds its first token, the offset of that token in the shard, and whether the sample runs on
    into the shard(s) after it."""
    offsets = np.asarray(token_offsets, dtype=np.int64)
    shards = np.searchsorted(offsets, starts, side="right") - 1
    local = starts - offsets[shards]
    runs_on = starts + width > offsets[shards + 1]
    return shards, local, runs_on
