"""Where one shard's copy (or re-hash) runs: :class:`ThreadCopier` in the calling thread, here; the Ray
engine's :class:`~ferry.service.transfer.ray_copier.RayCopier` as a task on a Ray cluster's nodes.

Both run the same :func:`~ferry.service.transfer.transfer.copy_shard` (stream, verify, create-only final
step) under the same :class:`~ferry.service.transfer.bandwidth.Bandwidth`; the executor around them keeps
the slots, retries, sources, statistics and events, whichever copier it has.
"""

from __future__ import annotations

import threading
from typing import Protocol

from ferry.shard_tools.storage.store import Location

from ..config_types import TransferConfig
from .bandwidth import Bandwidth
from .hashed_io import CHUNK_SIZE, Progress
from .transfer import copy_shard, verify_shard

__all__ = ["Copier", "ThreadCopier", "THIS_NODE", "make_copier"]

#: the node name the thread engine's copies take the per-node limit under (they all run here)
THIS_NODE = "local"


class Copier(Protocol):
    """Copies and verifies single shards; raises the error tree's errors (Cancelled once ``cancel`` is set)."""

    def copy(
        self,
        src: Location,
        dst: Location,
        path: str,
        size: int,
        digest: str,
        *,
        create_only: bool,
        link: str,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        """Bring ``path`` from ``src`` to ``dst`` whole and verified (``copy_shard``'s contract)."""

    def verify(self, dst: Location, path: str, size: int, digest: str, *, cancel: threading.Event) -> str | None:
        """None when ``dst`` holds the shard with this size and digest, else the reason it does not."""

    def close(self) -> None:
        """Release what the copier holds (nothing runs on it afterwards)."""


class ThreadCopier:
    """Copies in the calling thread of this process."""

    def __init__(self, bandwidth: Bandwidth, chunk_size: int = CHUNK_SIZE) -> None:
        self.bandwidth = bandwidth
        self.chunk_size = chunk_size

    def copy(
        self,
        src: Location,
        dst: Location,
        path: str,
        size: int,
        digest: str,
        *,
        create_only: bool,
        link: str,
        progress: Progress,
        cancel: threading.Event,
    ) -> None:
        def throttle(n: int) -> None:
            self.bandwidth.take(link, n, cancel, node=THIS_NODE)

        copy_shard(src, dst, path, size, digest, chunk_size=self.chunk_size, throttle=throttle, progress=progress,
                   cancel=cancel, create_only=create_only)  # fmt: skip

    def verify(self, dst: Location, path: str, size: int, digest: str, *, cancel: threading.Event) -> str | None:
        return verify_shard(dst, path, size, digest, chunk_size=self.chunk_size, cancel=cancel)

    def close(self) -> None:
        """Nothing to release."""


def make_copier(
    config: TransferConfig, bandwidth: Bandwidth, chunk_size: int = CHUNK_SIZE, *, from_flags: bool = False
) -> Copier:
    """The copier ``[transfer]`` chooses (the Ray engine connects to its cluster here: a UsageError when
    Ray is not installed or the cluster cannot be reached, naming ``ferry sync``'s flags if ``from_flags``)."""
    if config.engine == "ray":
        from .ray_copier import CONFIG_SETTINGS, SYNC_SETTINGS, RayCopier

        return RayCopier(bandwidth, address=config.address, max_retries=config.max_retries,
                         task_cpus=config.task_cpus, chunk_size=chunk_size,
                         settings=SYNC_SETTINGS if from_flags else CONFIG_SETTINGS)  # fmt: skip
    return ThreadCopier(bandwidth, chunk_size)
