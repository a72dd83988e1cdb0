"""The training-loop side of every multimodal runner: the same clock, decode and memory accounting for every tool.

A runner gives ``build(a)`` (its loader, construction counted in the time to the first batch) and ``count(batch)``
(decoded image–text samples in a batch). Every tool decodes its JPEGs with :func:`rgb` (Pillow, RGB, as a numpy
array) in its DataLoader workers. The loop times the first batch, then reads for ``max_seconds`` (at least
``min_batches``), or until it has delivered ``max_samples`` (where given: a pass over the same first samples of
the same shuffle, for every tool), starting a new epoch when one ends. Peak RSS is reported for the runner alone
and summed with its DataLoader workers' peaks (each process's ``VmHWM``, read every 20 batches and at the end,
before the workers stop).
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from _common import args, cpu_seconds, emit, now
from PIL import Image

# Pillow and its image plugins load before the clock, for every tool (the peers' libraries import Pillow themselves;
# ferry's runner would otherwise load it in each worker, within its time to the first batch)
Image.preinit()

__all__ = ["main", "rgb", "caption_ids"]


def rgb(image: Any) -> np.ndarray:
    """Encoded bytes or a Pillow image, decoded to an ``H x W x 3`` uint8 array."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        image = Image.open(io.BytesIO(bytes(image)))
    with image:
        return np.asarray(image.convert("RGB"))


def caption_ids(caption: str) -> np.ndarray:
    """A caption's token ids under the ``bytes`` tokenizer ferry packs with (its UTF-8 bytes)."""
    return np.frombuffer(caption.encode(), dtype=np.uint8).astype(np.int64)


def _hwm_kib(pid: int | str) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


def _workers_hwm_kib() -> float:
    """Sum of the peak RSS of this process's live descendants (its DataLoader workers)."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent[int(entry)] = int(f.read().rpartition(")")[2].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    mine, todo = [], [os.getpid()]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        mine += kids
        todo += kids
    return sum(_hwm_kib(p) for p in mine)


def main(build: Callable[[dict[str, Any]], Any], count: Callable[[Any], int]) -> None:
    a = args()
    t0 = now()
    loader = build(a)
    it = iter(loader)
    first_samples = count(next(it))
    first = now() - t0
    samples = batches = 0
    workers_kib = _workers_hwm_kib()
    t1, c1 = now(), cpu_seconds()
    seconds = float(a.get("max_seconds", 10.0))
    wanted = a.get("max_samples")
    while batches < a.get("min_batches", 5) or now() - t1 < seconds:
        if wanted is not None and samples + first_samples >= wanted:
            break
        try:
            batch = next(it)
        except StopIteration:
            if batches == 0 and samples == 0 and first_samples == 0:
                break
            it = iter(loader)
            continue
        samples += count(batch)
        batches += 1
        if batches % 20 == 0:  # workers restarted at an epoch's end take their peaks with them: read them now
            workers_kib = max(workers_kib, _workers_hwm_kib())
    wall, cpu = now() - t1, cpu_seconds() - c1
    workers_kib = max(workers_kib, _workers_hwm_kib())
    own_kib = _hwm_kib("self")
    del it
    emit(
        {
            "first_batch_s": first,
            "first_batch_samples": first_samples,
            "batches": batches,
            "samples": samples,
            "delivered_samples": samples + first_samples,
            "seconds": wall,
            "samples_per_s": samples / wall if wall > 0 else 0.0,
            "cpu_s": cpu,
            "samples_per_cpu_s": samples / cpu if cpu > 0 else 0.0,
            "peak_rss_total_mb": round((own_kib + workers_kib) / 1024, 1),
        }
    )
