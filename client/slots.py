"""Shared-memory slots that DataLoader workers put their batches' token windows in.

Without them a worker's item (a few batches of token windows, see :data:`~ferry.client.pipes.ITEM_BYTES`) is
pickled into the result pipe, and the training process reads it into fresh memory and unpickles it into new
arrays before it widens each batch to int64. With them the worker copies the windows into a slot of one anonymous
shared mapping and sends only where they lie; the training process widens each batch straight from the slot and
then frees it. The slots are mapped once, so their pages are faulted in once rather than for every item.

- **Who owns a slot.** Each worker has its own ``per_worker`` slots. A flag per slot says it is taken; a worker
  takes a free one, and the training process frees it once every batch in it was widened. Flags change only
  under one process-shared lock, whose acquire and release order the slot's bytes with the flag on any CPU.
- **Never a wait.** A worker that finds no free slot, or an item that does not fit, sends the item through the
  pipe as before. A lock not free within :data:`_LOCK_WAIT_S` (its holder died inside its few instructions) ends
  the use of the slots in that process: its items go by the pipe, and the slots it holds stay taken. An item
  left unread (an epoch left early) keeps its slot taken; its workers stop, and the next ones get new slots.
- **Nothing left behind.** The mapping is anonymous and inherited by forked workers: it goes when the last of
  the processes exits, however they end (no file in ``/dev/shm``). The lock comes from the ``fork`` context,
  whose semaphore has no name left on disk.
- **Only with fork.** Workers started another way (``spawn``, ``forkserver``) receive the slots pickled, which
  leaves them out: those workers use the pipe.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["Slots", "SlotRef"]

#: where a worker put a batch's windows: (slot, byte offset in the mapping, shape, dtype string)
SlotRef = tuple[int, int, tuple[int, ...], str]

_PAGE = mmap.PAGESIZE
_ALIGN = 64  # each batch's windows start at a multiple of this in a slot
# a lock held longer than this is given up on (its holder died inside; a process paused by a CPU quota holds
# it for a period of 100 ms at most), and the pipe carries on
_LOCK_WAIT_S = 1.0


class Slots:
    """``workers × per_worker`` slots of ``slot_bytes`` each (see the module docstring)."""

    def __init__(self, workers: int, per_worker: int, slot_bytes: int) -> None:
        self.workers, self.per_worker = workers, per_worker
        self.slot_bytes = _round_up(slot_bytes, _PAGE)
        self._head = _round_up(workers * per_worker, _PAGE)  # the flags, a byte per slot
        self._map: mmap.mmap | None = mmap.mmap(-1, self._head + workers * per_worker * self.slot_bytes)
        self._flags = np.frombuffer(self._map, dtype=np.uint8, count=workers * per_worker)
        self._lock: Any = multiprocessing.get_context("fork").Lock()
        self._on = True  # False: this process no longer takes or frees slots (see _acquire)
        self._used: dict[int, int] = {}  # training process: batches of each taken slot not yet widened

    @staticmethod
    def item_bytes(batches: int, batch_bytes: int) -> int:
        """The slot an item of ``batches`` batches of ``batch_bytes`` bytes of windows each needs."""
        return batches * _round_up(batch_bytes, _ALIGN)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_unusable, ())  # a worker not forked cannot share the mapping: it uses the pipe

    @property
    def usable(self) -> bool:
        return self._on

    def _acquire(self) -> bool:
        """The lock, or False (then never again in this process: see the module docstring)."""
        if self._on and self._lock.acquire(timeout=_LOCK_WAIT_S):
            return True
        self._on = False
        return False

    def _take(self, worker: int) -> int | None:
        """A free slot of ``worker``, now taken, or None."""
        if not self._acquire():
            return None
        try:
            first = worker * self.per_worker
            for slot in range(first, first + self.per_worker):
                if not self._flags[slot]:
                    self._flags[slot] = 1
                    return slot
            return None
        finally:
            self._lock.release()

    def put(self, worker: int, item: list[tuple[int, Any]]) -> list[tuple[int, Any]]:
        """In a worker: ``item`` with the ``windows`` of its payloads moved into a free slot (each payload's
        ``windows`` replaced by ``slot`` naming where it lies), or ``item`` unchanged (see the module docstring)."""
        windows = [p["windows"] for _, p in item if isinstance(p, Mapping) and "windows" in p]
        if not self._on or not windows or sum(_round_up(w.nbytes, _ALIGN) for w in windows) > self.slot_bytes:
            return item
        slot = self._take(worker)
        if slot is None:
            return item
        offset = self._head + slot * self.slot_bytes
        out: list[tuple[int, Any]] = []
        for k, payload in item:
            if not (isinstance(payload, Mapping) and "windows" in payload):
                out.append((k, payload))
                continue
            w = payload["windows"]
            self._view(offset, w.shape, w.dtype.str)[...] = w
            ref: SlotRef = (slot, offset, tuple(w.shape), w.dtype.str)
            out.append((k, {**{n: v for n, v in payload.items() if n != "windows"}, "slot": ref}))
            offset += _round_up(w.nbytes, _ALIGN)
        return out

    def received(self, item: list[tuple[int, Any]]) -> None:
        """In the training process, for each item from a worker: count the batches each slot holds."""
        for _, payload in item:
            if isinstance(payload, Mapping) and "slot" in payload:
                slot = payload["slot"][0]
                self._used[slot] = self._used.get(slot, 0) + 1

    def windows(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        """In the training process: ``payload`` with its windows read where the worker put them. The arrays
        are views of the slot: widen them (which copies) before :meth:`done` frees it."""
        if "slot" not in payload:
            return dict(payload)
        _slot, offset, shape, dtype = payload["slot"]
        out = {n: v for n, v in payload.items() if n != "slot"}
        out["windows"] = self._view(offset, shape, dtype)
        return out

    def done(self, payload: Mapping[str, Any]) -> None:
        """In the training process, after a batch from ``payload`` was widened: free its slot once it held no
        other batch still to widen."""
        if "slot" not in payload:
            return
        slot = payload["slot"][0]
        left = self._used.get(slot, 1) - 1
        if left > 0:
            self._used[slot] = left
            return
        self._used.pop(slot, None)
        if self._acquire():  # else the slot stays taken, and its worker uses the pipe
            try:
                self._flags[slot] = 0
            finally:
                self._lock.release()

    def _view(self, offset: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        assert self._map is not None
        count = math.prod(shape)  # not np.prod, far slower on a small tuple: once per batch in each process
        return np.frombuffer(self._map, dtype=np.dtype(dtype), count=count, offset=offset).reshape(shape)


def _round_up(n: int, unit: int) -> int:
    return -(-n // unit) * unit


def _unusable() -> Slots:
    """What a worker that was not forked gets: slots with no mapping, so that every item goes by the pipe."""
    slots = Slots.__new__(Slots)
    slots.workers = slots.per_worker = slots.slot_bytes = slots._head = 0
    slots._map = None
    slots._on = False
    slots._used = {}
    return slots
