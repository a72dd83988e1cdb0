"""A map-style view of a ferry dataset and the sampler that walks it in the loader's order.

For code that insists on ``torch.utils.data.Dataset`` + ``Sampler`` (``__len__`` /
``__getitem__``): ``MapStyleView(ds)[p]`` is the sample at stream position ``p`` (any
epoch), and ``StreamSampler`` yields, for one rank, exactly the positions
:class:`~ferry.client.stream.loader.TokenLoader` reads (:mod:`ferry.client.sampling.partition`). So
``DataLoader(MapStyleView(ds), sampler=StreamSampler(ds, B), batch_size=B)`` gives
TokenLoader's batches, for any ``num_workers``, and the sampler's state is TokenLoader's
state: either loads the other's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from ferry.shard_tools.errors import UsageError

from .. import checks
from ..resume.replan import resume
from ..resume.state import MAX_POSITION, make_state, parse_state
from ..sampling.partition import batches_until, global_batch_size, rank_positions
from ..source import SampleSource, to_batch
from ..stream.loader import SHAPE_LIMIT, rank_world

__all__ = ["MapStyleView", "StreamSampler"]

T = TypeVar("T")
Sample = dict[str, torch.Tensor]


class MapStyleView(Dataset[Sample]):
    """``view[p]``: the sample at stream position ``p`` as a dict of int64 tensors ``[seq_len]``.

    ``len(view)`` is the samples per epoch; positions ``>= len(view)`` are later epochs
    (epoch ``p // len(view)``, each its own permutation). Keys as in a TokenLoader batch:
    ``input_ids``, ``labels`` (document mode: and ``attention_mask``); with
    ``position_ids=True`` (token mode) also ``position_ids``, the position within the document.
    ``__getitems__`` reads a whole batch in one gather (DataLoader uses it when present).
    """

    def __init__(self, dataset: SampleSource, *, position_ids: bool = False) -> None:
        if not isinstance(dataset, SampleSource):
            raise UsageError(f"dataset must be a TokenDataset or MixedDataset, got {checks.show(dataset)}")
        self.dataset = dataset
        self.position_ids = checks.flag("position_ids", position_ids)
        if self.position_ids and dataset.mode != "tokens":
            raise UsageError("position_ids needs mode='tokens' (document mode gives attention_mask)")

    def __len__(self) -> int:
        return self.dataset.num_samples

    def __getitem__(self, position: int) -> Sample:
        return self.__getitems__([position])[0]

    def __getitems__(self, positions: list[int]) -> list[Sample]:
        pos = np.asarray([_position(p) for p in positions], dtype=np.int64)
        batch = to_batch(self.dataset.payload(pos, boundaries=self.position_ids))
        batch.pop("cu_seqlens", None)  # over the flattened batch: no per-sample meaning
        return [{k: v[i] for k, v in batch.items()} for i in range(len(pos))]


def _position(p: Any) -> int:
    return checks.integer("stream position", p, 0, MAX_POSITION)


class StreamSampler(Sampler[int]):
    """Stream positions of one rank's batches in TokenLoader's order, from where the sampler stands.

    Args:
        dataset: the ``TokenDataset`` / ``MixedDataset`` (or a :class:`MapStyleView` of it).
        batch_size: samples per batch on this rank; pass the same ``batch_size`` to ``DataLoader``.
        rank, world_size: default from ``torch.distributed``, else ``RANK``/``WORLD_SIZE``, else 0/1.

    One ``iter()`` runs to the end of the current epoch (its last global batch may reach into
    the next, as TokenLoader's does); the next ``iter()`` continues there. ``state_dict()`` is
    TokenLoader's state. DataLoader draws indices ahead of the loop (workers prefetch), so for a
    checkpoint in the middle of an epoch iterate through :meth:`track`, which counts a batch
    when it reaches the loop; without it the state moves once per completed ``iter()``.
    """

    def __init__(
        self,
        dataset: SampleSource | MapStyleView,
        batch_size: int,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        source = dataset.dataset if isinstance(dataset, MapStyleView) else dataset
        if not isinstance(source, SampleSource):
            raise UsageError(
                f"dataset must be a TokenDataset, MixedDataset or MapStyleView, got {checks.show(dataset)}"
            )
        self.dataset = source
        self._configured = source
        self._skips: list[dict[str, int]] = []
        self.batch_size = checks.integer("batch_size", batch_size, 1, SHAPE_LIMIT)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.position = 0  # stream position of the next global batch not yet delivered
        self._tracking = False

    @property
    def global_batch_size(self) -> int:
        return global_batch_size(self.batch_size, self.world_size)

    def _batches(self) -> int:
        """Global batches from ``position`` to the end of its epoch (what the next ``iter()`` covers)."""
        n = self.dataset.num_samples
        return batches_until(self.position, (self.position // n + 1) * n, self.batch_size, self.world_size)

    def __len__(self) -> int:
        return self._batches() * self.batch_size

    def __iter__(self) -> Iterator[int]:
        start, count = self.position, self._batches()
        for k in range(count):
            yield from rank_positions(start, k, self.batch_size, self.world_size, self.rank).tolist()
        if not self._tracking:  # track() has already counted each batch as it reached the loop
            self.position = start + count * self.global_batch_size

    def track(self, batches: Iterable[T]) -> Iterator[T]:
        """Yield from ``batches`` (the DataLoader over this sampler), counting each batch as delivered.

        Raises UsageError when a batch is not ``batch_size`` samples long (the DataLoader was
        given another ``batch_size`` than the sampler).
        """
        start, g = self.position, self.global_batch_size
        self._tracking = True
        try:
            for k, batch in enumerate(batches):
                _check_rows(batch, self.batch_size)
                self.position = start + (k + 1) * g
                yield batch
        finally:
            self._tracking = False

    def state_dict(self) -> dict[str, Any]:
        """TokenLoader's state at the sampler's position (JSON-serialisable; a ``Stateful`` for DCP)."""
        span = self.dataset.epoch_span(self.position)
        return make_state(self._configured.identity(), self.position, span, skips=self._skips, **self.dataset.record())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        """Continue after the state's last delivered batch (a TokenLoader's or a sampler's; any world size)."""
        saved = parse_state(state_dict)
        dataset, position = resume(self._configured, saved, strict=strict, replan=False)
        if dataset is not self.dataset and dataset.identity() != self.dataset.identity():
            raise UsageError(
                "this state continues a run on another dataset version or plan (its eras): load it into a "
                "TokenLoader, or into a StreamSampler over a view of that dataset"
            )
        self.position, self._skips = position, saved.skips


def _check_rows(batch: Any, batch_size: int) -> None:
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    if not isinstance(ids, torch.Tensor):
        return
    rows = ids.shape[0] if ids.ndim == 2 else None  # one sample (ndim 1): DataLoader(batch_size=None)
    if rows != batch_size:
        got = f"{rows} samples" if rows is not None else f"one sample of shape {tuple(ids.shape)}, not a batch"
        raise UsageError(
            f"a batch has {got} but the StreamSampler has batch_size={batch_size}; give DataLoader the sampler's "
            "batch_size"
        )
