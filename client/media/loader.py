"""``MediaLoader``: batches of packed sequences with their media, and the state that resumes them exactly.

A batch is a dict of tensors ``input_ids``, ``labels``, ``position_ids`` (``batch × seq_len``),
``documents`` (rows ``(row, document, start, length, start in the document)``), ``media_spans`` (rows
``(row, start, length)``), and the list ``media``: the items (or what the dataset's ``decode`` hook made of
them) in the order of ``media_spans``; numpy arrays a worker made arrive as views of one shared buffer per
batch (:mod:`ferry.client.media.handover`). :meth:`MediaLoader.state_dict` after a batch, given to
:meth:`MediaLoader.load_state_dict` of a new loader over the same dataset, continues with the next batch:
the sequences are a pure function of the dataset, seed and epoch (:mod:`ferry.client.media.planner`), the
global stream of them does not depend on ranks or workers (:mod:`ferry.client.media.source`), and the state is
the position of the next global batch in it, so a run resumed with another world size, batch size or number of
workers reads on exactly where the saved one stopped. ``positions`` lists each row's stream position (and
``sources``, in a mixture, its source).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ferry.shard_tools.errors import UsageError
from ferry.shard_tools.format.media import MediaItem

from ..pipes import widen_result_pipe
from ..sampling.partition import rank_positions
from .handover import pack, unpack
from .source import MediaSource

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
        "positions": [int(s["position"]) for s in samples],
        **({"sources": [int(s["source"]) for s in samples]} if "source" in samples[0] else {}),
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
    """Whole batches made in the workers: worker ``w`` of ``n`` makes the rank's batches ``w, w + n, …`` and the
    DataLoader hands them out in that order, so the stream is the same for any number of workers."""

    def __init__(self, source: MediaSource, batch_size: int) -> None:
        self.source, self.batch_size = source, batch_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        for k in self.source.batches(self.batch_size):
            if k % workers == worker:
                positions = self.source.batch_positions(k, self.batch_size).tolist()
                self.source.prefetch_at(positions)  # the batch's frames in one go (remote replicas)
                batch = collate([self.source.sample_at(p) for p in positions])
                if info is not None:  # decoded arrays cross to the training process in one shared buffer
                    batch["media"] = pack(batch["media"])
                yield batch
        # the disk cache's fills of the last shards end before the worker does (a full disk is raised here)
        self.source.settle()


def _whole(batch: Any) -> Any:
    """The DataLoader's collate function: batches come whole from :class:`_Batches`."""
    return batch


class MediaLoader:
    """Batches of a :class:`MediaDataset`'s (or :class:`~ferry.client.media.mixed.MediaMixture`'s) sequences for
    the source's rank, with exact and elastic resume (see the module docstring)."""

    def __init__(self, dataset: MediaSource, batch_size: int, *, num_workers: int = 0, **loader_kwargs: Any) -> None:
        if batch_size < 1 or num_workers < 0:
            raise UsageError(
                f"MediaLoader: batch_size must be >= 1 and num_workers >= 0, got {batch_size}, {num_workers}"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.loader_kwargs = loader_kwargs
        self._position = dataset.start  # stream position of the next global batch not yet delivered

    @property
    def position(self) -> int:
        """Global sequences delivered so far (over all ranks): the stream position of the next global batch."""
        return self._position

    @property
    def global_batch_size(self) -> int:
        return self.batch_size * self.dataset.world_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        source = self.dataset
        source.start = start = self._position
        source.warm()  # the shards' metadata and the first epoch's plan, made once here: workers inherit them
        loader = DataLoader(
            _Batches(source, self.batch_size),
            batch_size=None,
            num_workers=self.num_workers,
            collate_fn=_whole,
            **self.loader_kwargs,
        )
        batches = iter(loader)
        widen_result_pipe(batches)
        for k, batch in enumerate(batches):
            # counted as consumed when handed over: every rank has then delivered its part of global batch k
            self._position = start + (k + 1) * self.global_batch_size
            batch["media"] = unpack(batch["media"])
            yield batch

    def trace(
        self, positions: Sequence[int] | np.ndarray | None = None, *, step: int | None = None
    ) -> list[dict[str, Any]]:
        """Where sequences came from (:mod:`ferry.client.media.trace`): stream ``positions``, or this rank's batch
        of global ``step`` (positions ``step·G + rank·batch_size …``), or by default the next batch."""
        from .trace import trace_media

        if positions is None:
            if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
                raise UsageError(f"step must be a non-negative integer, got {step!r}")
            first = self._position if step is None else step * self.global_batch_size
            ds = self.dataset
            positions = rank_positions(first, 0, self.batch_size, ds.world_size, ds.rank).tolist()
        return trace_media(self.dataset, positions)

    def state_dict(self) -> dict[str, Any]:
        """Where the next global batch starts: a JSON-serialisable dict that any number of ranks, workers, or
        another batch size, continues from."""
        return self.dataset.state_at(self._position)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self._position = self.dataset.start
