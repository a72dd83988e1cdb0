"""``MediaLoader``: batches of packed sequences with their media, and the state that resumes them exactly.

A batch is a dict of tensors ``input_ids``, ``labels``, ``position_ids`` (``batch × seq_len``),
``documents`` (rows ``(row, document, start, length, start in the document)``), ``media_spans`` (rows
``(row, start, length)``), and the list ``media``: the items (or what the dataset's ``decode`` hook made of
them) in the order of ``media_spans``. :meth:`MediaLoader.state_dict` after a batch, given to
:meth:`MediaLoader.load_state_dict` of a new loader over the same dataset, continues with the next batch:
the sequences are a pure function of the dataset, seed and epoch (:mod:`ferry.client.media.planner`), and
DataLoader workers take them in turn, so the stream is the same with any number of workers.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ferry.shard_tools.errors import UsageError
from ferry.shard_tools.format.media import MediaItem

from .dataset import MediaDataset

__all__ = ["MediaLoader", "collate", "decode_image"]


def collate(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One batch from samples of :meth:`MediaDataset.sample`."""

    def rows(key: str) -> torch.Tensor:
        parts = [np.column_stack([np.full(len(s[key]), r), s[key]]) for r, s in enumerate(samples) if len(s[key])]
        width = samples[0][key].shape[1] + 1
        return torch.as_tensor(np.concatenate(parts) if parts else np.zeros((0, width), dtype=np.int64))

    return {
        "input_ids": torch.as_tensor(np.stack([s["input_ids"] for s in samples])),
        "labels": torch.as_tensor(np.stack([s["labels"] for s in samples])),
        "position_ids": torch.as_tensor(np.stack([s["position_ids"] for s in samples])),
        "documents": rows("documents"),
        "media_spans": rows("media_spans"),
        "media": [m for s in samples for m in s["media"]],
        "positions": [(int(s["epoch"]), int(s["index"])) for s in samples],
    }


def decode_image(item: MediaItem) -> Any:
    """A ``decode`` hook: images as RGB ``PIL.Image`` objects (other kinds as their items)."""
    if item.kind != "image":
        return item
    import io

    from PIL import Image

    with Image.open(io.BytesIO(item.data)) as image:
        return image.convert("RGB")


class _Batches(IterableDataset[dict[str, Any]]):
    """Whole batches made in the workers: worker ``w`` of ``n`` makes batches ``w, w + n, …`` of the stream, and
    the DataLoader hands them out in that order, so the stream is the same for any number of workers."""

    def __init__(self, dataset: MediaDataset, batch_size: int) -> None:
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        chunk: list[tuple[int, int]] = []
        number = 0
        for position in self.dataset.positions():
            chunk.append(position)
            if len(chunk) == self.batch_size:
                if number % workers == worker:
                    self.dataset.prefetch(chunk)  # the batch's frames in one go (remote replicas)
                    yield collate([self.dataset.sample(*p) for p in chunk])
                chunk, number = [], number + 1
        if chunk and number % workers == worker:
            self.dataset.prefetch(chunk)
            yield collate([self.dataset.sample(*p) for p in chunk])


def _whole(batch: Any) -> Any:
    """The DataLoader's collate function: batches come whole from :class:`_Batches`."""
    return batch


class MediaLoader:
    """Batches of :class:`MediaDataset` sequences, with exact resume (see the module docstring)."""

    def __init__(self, dataset: MediaDataset, batch_size: int, *, num_workers: int = 0, **loader_kwargs: Any) -> None:
        if batch_size < 1 or num_workers < 0:
            raise UsageError(
                f"MediaLoader: batch_size must be >= 1 and num_workers >= 0, got {batch_size}, {num_workers}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.loader_kwargs = loader_kwargs
        self._last: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        # the shards' metadata and the first epoch's plan, made once here: workers inherit them
        self.dataset.plan(self.dataset.start_epoch)
        loader = DataLoader(
            _Batches(self.dataset, self.batch_size),
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_whole,
            **self.loader_kwargs,
        )
        for batch in loader:
            self._last = batch["positions"][-1]
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts."""
        if self._last is None:
            d = self.dataset
            return {"epoch": d.start_epoch, "index": d.start_index, "fingerprint": d._fingerprint()}
        return self.dataset.state_after(*self._last)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self._last = None
