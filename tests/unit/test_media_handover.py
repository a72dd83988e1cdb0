"""Decoded media cross from a DataLoader worker in one shared buffer per batch, and come back the same."""

from __future__ import annotations

import os
import pickle
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch", reason="the loader extra installs torch")

from ferry.client.media import handover  # noqa: E402
from ferry.client.media.handover import MIN_BYTES, PackedMedia, pack, unpack  # noqa: E402


def _root(a: np.ndarray) -> Any:
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a.base


def _media() -> list[Any]:
    rng = np.random.default_rng(1)
    return [
        rng.integers(0, 256, (600, 700, 3), dtype=np.uint8),  # decoded pixels (1.2 MiB)
        b"\xff\xd8 not decoded",  # kept as it is
        rng.standard_normal(16000).astype(np.float32),  # audio samples
        np.arange(12, dtype=">i4").reshape(3, 4),  # big-endian, 2-D
        rng.integers(0, 256, (200, 300, 3), dtype=np.uint8)[::2, ::-1],  # not contiguous
        np.array(7.5),  # 0-d
        np.zeros((0, 3), dtype=np.int64),  # empty
        np.array([True, False, True]),
        np.array(["a", None], dtype=object),  # object arrays are pickled
        {"kind": "other"},
    ]


def _same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, np.ndarray):
            assert isinstance(g, np.ndarray) and g.dtype == w.dtype and g.shape == w.shape
            assert np.array_equal(g, w) if w.dtype != object else list(g) == list(w)
        else:
            assert g == w


def test_a_batch_over_the_threshold_is_packed_and_unpacked_to_equal_arrays_in_one_buffer() -> None:
    media = _media()
    packed = pack(media)
    assert isinstance(packed, PackedMedia) and packed.buffer.is_shared()
    back = unpack(pickle.loads(pickle.dumps(packed)))
    _same(back, media)
    numeric = [b for b, m in zip(back, media, strict=True) if isinstance(m, np.ndarray) and m.dtype != object]
    assert len({id(_root(a)) for a in numeric}) == 1  # views of one buffer
    assert all(a.flags.writeable and a.flags.aligned for a in numeric)
    assert all(p[0] % 64 == 0 for p in packed.layout if p is not None)
    numeric[0][0, 0, 0] ^= 1  # a view is the user's to write, the others stay as they were
    _same(back[1:], media[1:])


def test_through_the_workers_pickler_the_buffer_travels_as_shared_memory() -> None:
    packed = pack(_media())
    assert isinstance(packed, PackedMedia)
    data = bytes(ForkingPickler.dumps(packed))
    assert len(data) < MIN_BYTES // 16  # the pixels are not in the pickle: a handle to the segment is
    _same(unpack(pickle.loads(data)), _media())


def test_small_batches_and_batches_without_arrays_stay_lists() -> None:
    small = [np.zeros(10, dtype=np.uint8), b"x"]
    assert pack(small) == small and unpack(small) == small
    assert pack([b"y" * (2 * MIN_BYTES)]) == [b"y" * (2 * MIN_BYTES)]


def test_the_threshold_counts_only_the_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handover, "MIN_BYTES", 100)
    assert isinstance(pack([np.zeros(100, dtype=np.uint8)]), PackedMedia)
    assert isinstance(pack([np.zeros(99, dtype=np.uint8), b"z" * 1000]), list)


def test_a_batch_too_large_for_the_free_shared_memory_travels_pickled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A container's small /dev/shm: a batch over its share of the free space is not packed, so it cannot fail
    where the pipe would carry it."""
    media = _media()
    need = sum(handover._aligned(a.nbytes) for a in media if isinstance(a, np.ndarray) and a.dtype != object)
    monkeypatch.setattr(handover, "shm_free", lambda: (need - 1) * handover.SHM_SHARE)
    assert isinstance(pack(media), list)
    monkeypatch.setattr(handover, "shm_free", lambda: need * handover.SHM_SHARE)
    assert isinstance(pack(media), PackedMedia)
    monkeypatch.undo()
    monkeypatch.setattr(handover, "SHM_DIR", "/nonexistent/shm")
    assert handover.shm_free() == 0 and isinstance(pack(media), list)


def test_shm_free_reads_the_shared_memory_filesystem() -> None:
    st = os.statvfs("/dev/shm")  # other processes may take or give back space meanwhile: bounds, not equality
    assert 0 < handover.shm_free() <= st.f_blocks * st.f_frsize
