"""The result of one replication pass (kept apart from the engine: ``ferry sync``'s no-op reports one
without loading the engine and its storage stack)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..transfer.executor import JobResult

__all__ = ["PassResult"]


@dataclass
class PassResult:
    """What a pass did at one destination."""

    dataset: str
    source: str
    destination: str
    version_id: str
    up_to_date: bool = False
    published: bool = False
    copied: int = 0
    copied_bytes: int = 0
    verified_in_place: int = 0
    already_verified: int = 0
    verified_bytes: int = 0  # bytes of the version verified at the destination so far
    failed: list[JobResult] = field(default_factory=list)
    skipped_failed: int = 0  # shards failed fatally before, waiting for retry()
    temps_deleted: int = 0
    corrupt_detected: int = 0
    retired: list[str] = field(default_factory=list)
    deleted_shards: list[str] = field(default_factory=list)
    protected_shards: list[str] = field(default_factory=list)
    cancelled: bool = False
    total_shards: int = 0
    total_bytes: int = 0
    seconds: float = 0.0

    @classmethod
    def of_source(cls, dataset: str, source: str, destination: str, header: dict[str, Any]) -> PassResult:
        """A pass towards the version a source's parsed ``manifest.json`` header names."""
        res = cls(dataset, source, destination, str(header["version_id"]))
        res.total_shards, res.total_bytes = int(header["totals"]["shards"]), int(header["totals"]["stored_bytes"])
        return res

    def mark_up_to_date(self) -> None:
        """The destination already publishes this version: every shard counts as verified there."""
        self.up_to_date = True
        self.already_verified, self.verified_bytes = self.total_shards, self.total_bytes

    @property
    def ok(self) -> bool:
        return not self.failed and not self.skipped_failed and not self.cancelled
