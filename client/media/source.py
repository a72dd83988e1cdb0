"""``MediaSource``: what :class:`~ferry.client.media.loader.MediaLoader` reads, a stream of packed sequences.

Position ``p`` of the stream is one sequence whatever the number of ranks, workers or the batch size (a
:class:`~ferry.client.media.dataset.MediaDataset`'s epochs back to back, or a
:class:`~ferry.client.media.mixed.MediaMixture`'s schedule over its sources). Ranks and workers split the
positions as the text loader splits its stream (:mod:`ferry.client.sampling.partition`): from position ``start``
the ``k``-th global batch is ``[start + k·G, start + (k + 1)·G)`` with ``G = batch_size · world_size``, rank
``r`` takes ``batch_size`` positions of it from ``start + k·G + r·batch_size``, DataLoader worker ``w`` of ``n``
makes the rank's batches ``k ≡ w (mod n)``. A state is the position of the next global batch, so a run
resumed with another world size, batch size or number of workers reads the same global stream on.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from ferry.shard_tools.errors import StateError, UsageError

from ..sampling.partition import global_batch_size, rank_positions

__all__ = ["MediaSource", "POSITION_LIMIT"]

POSITION_LIMIT = 2**62  # exclusive bound of a stream position (as the text loader's states)


class MediaSource(IterableDataset[dict[str, Any]]):
    """A stream of packed sequences with their media (see the module docstring)."""

    seq_len: int
    rank: int
    world_size: int
    start: int = 0  # the position this reading starts at (a loaded state's)

    # -- what a source defines ---------------------------------------------------------------------------------

    def sample_at(self, position: int) -> dict[str, Any]:
        """The sequence at stream ``position``, with ``position`` (and, in a mixture, ``source``) in it."""
        raise NotImplementedError

    def prefetch_at(self, positions: Iterable[int]) -> None:
        """Fetch together what the sequences at ``positions`` read (remote replicas: their round trips overlap)."""

    def ended(self, position: int) -> bool:
        """Whether ``position`` lies past the end of this reading (asked in order: it may plan as it goes)."""
        raise NotImplementedError

    def fingerprint(self) -> list[Any]:
        """What fixes the stream: a state of another fingerprint is refused."""
        raise NotImplementedError

    def anchors(self, position: int) -> list[list[int]]:
        """Per dataset of the stream, ``[epoch, first position of that epoch]`` of where it stands at ``position``."""
        raise NotImplementedError

    def adopt(self, anchors: Any, position: int) -> None:
        """Take a state's anchors of ``position`` as known (a :class:`StateError` if they do not fit)."""
        raise NotImplementedError

    def warm(self) -> None:
        """Read and plan what the first sequences need (done once before DataLoader workers start: they inherit it)."""

    def settle(self) -> None:
        """Let this process's background work end (the disk cache's fills); raise a failure of the cache itself."""

    def trace_at(self, position: int) -> dict[str, Any]:
        """Where the sequence at ``position`` came from (:mod:`ferry.client.media.trace`)."""
        raise NotImplementedError

    # -- states ------------------------------------------------------------------------------------------------

    def state_at(self, position: int) -> dict[str, Any]:
        """The state that starts a reading at stream ``position`` (JSON-serialisable)."""
        return {"position": position, "anchors": self.anchors(position), "fingerprint": self.fingerprint()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Start at the state's position (a state of :meth:`state_at`: the same stream, any ranks or workers)."""
        if not isinstance(state, Mapping):
            raise StateError(f"a media loader state is a dict, got {type(state).__name__}")
        if "index" in state and "position" not in state:
            raise StateError("the state is a per-rank media loader state of an earlier ferry (epoch and index of one "
                             "rank's share); it cannot be continued: start the reading again")  # fmt: skip
        if list(state.get("fingerprint", [])) != self.fingerprint():
            raise StateError(
                f"the state is of another reading (version, seq_len, seed, caps, mixture): "
                f"{state.get('fingerprint')} against {self.fingerprint()}"
            )
        position = state.get("position")
        if isinstance(position, bool) or not isinstance(position, int) or not 0 <= position < POSITION_LIMIT:
            raise StateError(f"a media loader state's position must be an integer in [0, 2**62), got {position!r}")
        self.adopt(state.get("anchors"), position)
        self.start = position

    # -- ranks and workers -------------------------------------------------------------------------------------

    def batches(self, batch_size: int) -> Iterator[int]:
        """Numbers of this rank's batches of ``batch_size`` from :attr:`start`, to the last global batch that
        starts before the reading's end (it may reach past it, so that every rank reads as many), or without end."""
        g = global_batch_size(batch_size, self.world_size)
        for k in itertools.count():
            if self.ended(self.start + k * g):
                return
            yield k

    def batch_positions(self, k: int, batch_size: int) -> np.ndarray:
        """The stream positions of this rank's batch ``k`` from :attr:`start`."""
        return rank_positions(self.start, k, batch_size, self.world_size, self.rank)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This rank's sequences one by one (batches of one); DataLoader worker ``w`` of ``n`` makes ``w, w + n, …``
        (for batches and exact resume use :class:`~ferry.client.media.loader.MediaLoader`)."""
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        for k in self.batches(1):
            if k % workers == worker:
                yield self.sample_at(int(self.batch_positions(k, 1)[0]))


def check_shape(rank: int, world_size: int) -> None:
    """A ``UsageError`` unless ``0 <= rank < world_size``."""
    if not 0 <= rank < world_size:
        raise UsageError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
