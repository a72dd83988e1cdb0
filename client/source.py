"""What the loader reads: a ``SampleSource`` maps stream positions to samples, and payloads become tensors.

A source has ``num_samples`` samples per epoch and an endless stream of positions
(epoch ``e`` covers ``[e*n, (e+1)*n)``). It writes the samples at given positions into
a compact *payload* (token mode: the raw ``[B, seq_len + 1]`` windows in the token
dtype; document mode: finished int64 arrays), which :func:`to_batch` turns into the
batch tensors. Payloads are what DataLoader workers send to the main process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

__all__ = ["SampleSource", "MODES", "to_batch"]

MODES = ("tokens", "document")


class SampleSource(IterableDataset[dict[str, torch.Tensor]]):
    """What :class:`~ferry.client.stream.loader.TokenLoader` reads: ``n`` samples per epoch, written into batches."""

    seq_len: int
    mode: str
    num_samples: int
    prefetch_depth: int
    token_dtype: np.dtype

    def identity(self) -> dict[str, Any]:
        """Everything that fixes the sample order (goes into the loader state's fingerprint)."""
        raise NotImplementedError

    def epoch_span(self, position: int) -> tuple[int, int, int]:
        """The epoch of stream ``position``, and that epoch's first and end positions."""
        n = self.num_samples
        epoch = position // n
        return epoch, epoch * n, (epoch + 1) * n

    def record(self) -> dict[str, Any]:
        """The history a state must carry to reproduce this source's stream (``plan``, ``eras``); none by default."""
        return {}

    def restored(self, saved: Any) -> SampleSource:
        """This source with the history of ``saved`` (a :class:`~ferry.client.resume.state.SavedState` of this
        configuration)."""
        return self

    def replanned(self, saved: Any) -> tuple[SampleSource, int]:
        """This source continuing the run of ``saved`` (another configuration), and the position to go on from."""
        from ferry.shard_tools.errors import StateError

        raise StateError(f"a loader over {self!r} cannot continue a run of another configuration")

    @property
    def url(self) -> str | None:
        """Where the data lives (shown by ``ferry state show``), if it is one dataset."""
        return None

    def fill(self, positions: np.ndarray, rows: np.ndarray, out: Mapping[str, np.ndarray]) -> None:
        """Write the samples at stream ``positions`` into rows ``rows`` of the arrays in ``out``: token mode
        ``out["windows"]`` (token dtype, ``seq_len + 1`` wide); document mode ``input_ids``, ``labels``
        and ``attention_mask`` (int64)."""
        raise NotImplementedError

    def boundaries(self, positions: np.ndarray) -> list[list[int]]:
        """Per sample, offsets in ``(0, seq_len)`` where a document starts (token mode)."""
        raise NotImplementedError

    def prefetch(self, positions: np.ndarray) -> None:
        """Start fetching, in the background, the shards the samples at ``positions`` will need."""

    def settle(self) -> None:
        """Let this process's background fetches end (running ones finish, queued ones are dropped)."""

    def raise_deferred(self) -> None:
        """Raise the node-cache failure (``CacheError``, a full disk) that a background fetch of this process
        met, if one did: the loader calls it after its last batch, where no later read would raise it."""

    def close(self) -> None:
        """Release mapped shards and background threads of this process."""

    def __len__(self) -> int:
        return self.num_samples

    def payload(self, positions: np.ndarray, *, boundaries: bool = False) -> dict[str, Any]:
        """The samples at stream ``positions`` in compact form (what DataLoader workers send): token mode
        the raw ``[B, seq_len + 1]`` windows in the token dtype, document mode the finished int64 arrays."""
        pos = np.asarray(positions, dtype=np.int64)
        b, length = len(pos), self.seq_len
        rows = np.arange(b)
        if self.mode == "document":
            arrays = {k: np.empty((b, length), dtype=np.int64) for k in ("input_ids", "labels", "attention_mask")}
            self.fill(pos, rows, arrays)
            return arrays
        windows = np.empty((b, length + 1), dtype=self.token_dtype)
        self.fill(pos, rows, {"windows": windows})
        out: dict[str, Any] = {"windows": windows}
        if boundaries:
            out["boundaries"] = self.boundaries(pos)
        return out

    def planned_payload(
        self, key: object, i: int, positions_of: Callable[[int], np.ndarray], *, boundaries: bool = False
    ) -> dict[str, Any]:
        """The payload of the ``i``-th batch of a sequence of batches a loader reads (``key`` names the sequence,
        ``positions_of(j)`` gives the stream positions of its ``j``-th batch): a source may plan the reads of
        coming batches together. By default the payload of ``positions_of(i)``."""
        return self.payload(positions_of(i), boundaries=boundaries)

    def batch(self, positions: np.ndarray, *, boundaries: bool = False) -> dict[str, torch.Tensor]:
        """The samples at stream ``positions`` as a batch dict of int64 tensors ``[len(positions), seq_len]``."""
        return to_batch(self.payload(positions, boundaries=boundaries))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        """Single samples of epoch 0 for plain ``DataLoader`` use: rank ``RANK`` of ``WORLD_SIZE`` and each
        worker take every ``world_size * workers``-th position. For exact resume use ``TokenLoader``."""
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for p in range(rank * workers + wid, self.num_samples, world * workers):
            sample = self.batch(np.asarray([p]))
            yield {k: v[0] for k, v in sample.items()}


def to_batch(payload: Mapping[str, Any], *, shared_labels: bool = False) -> dict[str, torch.Tensor]:
    """Tensors from a payload: windows are widened to int64 ``input_ids = w[:, :-1]``, ``labels = w[:, 1:]``.

    By default the two are separate contiguous tensors. With ``shared_labels`` the windows are widened once, into
    one ``[B, seq_len + 1]`` int64 buffer, and ``input_ids`` and ``labels`` are two overlapping views of it (half
    the bytes written; changing one in place changes the other; neither is contiguous)."""
    if "windows" not in payload:
        return {k: torch.from_numpy(v) for k, v in payload.items()}
    windows = payload["windows"]
    b, length = windows.shape[0], windows.shape[1] - 1
    # numpy's allocator, then torch.from_numpy: less time per batch than torch.empty, measured
    if shared_labels:
        both = np.empty((b, length + 1), dtype=np.int64)
        np.copyto(both, windows)
        # numpy's views, then torch.from_numpy: less time per batch than slicing a tensor, measured
        out = {"input_ids": torch.from_numpy(both[:, :-1]), "labels": torch.from_numpy(both[:, 1:])}
    else:
        inputs = np.empty((b, length), dtype=np.int64)
        labels = np.empty((b, length), dtype=np.int64)
        np.copyto(inputs, windows[:, :-1])
        np.copyto(labels, windows[:, 1:])
        out = {"input_ids": torch.from_numpy(inputs), "labels": torch.from_numpy(labels)}
    if "boundaries" in payload:
        out.update(_varlen(payload["boundaries"], length))
    return out


def _varlen(bounds: list[list[int]], length: int) -> dict[str, torch.Tensor]:
    """``cu_seqlens`` (int32, flattened batch, flash-attn varlen style) and ``position_ids`` from boundaries."""
    cu: list[int] = [0]
    pos = np.empty((len(bounds), length), dtype=np.int64)
    for row, inner in enumerate(bounds):
        cuts = [0, *inner, length]
        base = row * length
        cu.extend(base + c for c in cuts[1:])
        seg_start = np.repeat(np.asarray(cuts[:-1]), np.diff(cuts))
        pos[row] = np.arange(length) - seg_start
    return {"cu_seqlens": torch.tensor(cu, dtype=torch.int32), "position_ids": torch.from_numpy(pos)}
