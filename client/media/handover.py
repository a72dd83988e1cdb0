"""A batch's decoded media from a DataLoader worker to the training process in one shared-memory buffer.

A ``decode`` hook that returns numpy arrays (decoded pixels, audio samples) makes batches of megabytes. Sent as
they are, each array is pickled through the worker's pipe: copied into the pickle, through the pipe, and out of
it again. :func:`pack` copies a batch's arrays once into one tensor made in shared memory, which the DataLoader
hands over as a file descriptor; :func:`unpack` gives back the same list, each array a view of that buffer with
its dtype and shape. One buffer per batch, not one per array: a shared-memory segment costs a file and a
mapping each, more than a pipe for small arrays (so batches under ``MIN_BYTES`` travel as before). Items that
are not numeric numpy arrays (images as Pillow objects, :class:`~ferry.shard_tools.format.media.MediaItem`)
travel pickled, unchanged. The buffers live in ``/dev/shm`` while batches wait for the training loop, and a
container's is often small (64 MiB by default in Docker): a batch larger than ``1/SHM_SHARE`` of its free
space travels pickled too, so a full ``/dev/shm`` never fails a batch that a pipe would carry.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["PackedMedia", "pack", "unpack", "shm_free", "MIN_BYTES", "SHM_SHARE"]

#: arrays of a batch smaller than this together go through the pipe (a segment's own cost is not worth it)
MIN_BYTES = 1 << 20


@dataclass(frozen=True)
class PackedMedia:
    """A media list whose numeric arrays live in ``buffer``: ``layout[i]`` is ``(offset, shape, dtype)`` for such
    an item, None for one kept in ``items`` as it was."""

    buffer: torch.Tensor
    layout: tuple[tuple[int, tuple[int, ...], str] | None, ...]
    items: tuple[Any, ...]


#: a batch takes at most this share of /dev/shm's free space (workers × prefetch batches wait there at once)
SHM_SHARE = 8
#: where torch makes the shared-memory files of tensors
SHM_DIR = "/dev/shm"

#: every array starts at a multiple of this in the buffer (aligned for any dtype numpy and torch use)
_ALIGN = 64


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _packable(item: Any) -> bool:
    return isinstance(item, np.ndarray) and item.dtype.kind in "biufc" and not item.dtype.hasobject


def shm_free() -> int:
    """Bytes free in ``SHM_DIR`` for this user (0 where there is none)."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return int(st.f_bavail) * int(st.f_frsize)


def pack(media: Sequence[Any]) -> PackedMedia | list[Any]:
    """``media`` with its arrays in one shared-memory buffer, or the list as it is when they are under
    ``MIN_BYTES`` together."""
    arrays = [m for m in media if _packable(m)]
    if sum(int(a.nbytes) for a in arrays) < MIN_BYTES:
        return list(media)
    total = sum(_aligned(int(a.nbytes)) for a in arrays)
    if total > shm_free() // SHM_SHARE:
        return list(media)
    buffer = torch.empty(total, dtype=torch.uint8).share_memory_()  # made shared: the hand-over copies nothing
    flat = buffer.numpy()
    layout: list[tuple[int, tuple[int, ...], str] | None] = []
    items: list[Any] = []
    offset = 0
    for m in media:
        if not _packable(m):
            layout.append(None)
            items.append(m)
            continue
        n = int(m.nbytes)
        flat[offset : offset + n] = np.ascontiguousarray(m).reshape(-1).view(np.uint8)
        layout.append((offset, tuple(int(d) for d in m.shape), m.dtype.str))
        items.append(None)
        offset += _aligned(n)
    return PackedMedia(buffer, tuple(layout), tuple(items))


def unpack(media: PackedMedia | list[Any]) -> list[Any]:
    """The media list :func:`pack` was given: its arrays as views of the shared buffer (equal values, dtype and
    shape, writable; the buffer lives as long as any of them)."""
    if not isinstance(media, PackedMedia):
        return media
    flat = media.buffer.numpy()
    out: list[Any] = []
    for place, item in zip(media.layout, media.items, strict=True):
        if place is None:
            out.append(item)
            continue
        offset, shape, dtype = place
        kind = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
        out.append(flat[offset : offset + n].view(kind).reshape(shape))
    return out
