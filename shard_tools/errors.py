"""ferry's one error hierarchy, shared by shard_tools, client and service.

    FerryError
    ├── UsageError                  bad arguments or configuration (exit code 2)
    │   ├── NotFoundError           the named dataset, cluster, link or error id is unknown (HTTP 404)
    │   └── InvalidValueError       an argument's value is out of range (also a ValueError: NaN, 2**80, -3)
    ├── InputFormatError            an input corpus file cannot be read as its format
    │   └── MegatronIndexError      a Megatron .idx with a wrong magic, version or layout
    ├── TokenRangeError             a token id does not fit the declared vocabulary / dtype
    ├── DatasetError                a dataset cannot be read or trusted
    │   ├── DatasetNotFoundError    no manifest.json at the URL
    │   ├── ManifestError           manifest malformed, hand-edited or failing its digest
    │   └── ShardError              one shard is bad; ``.shard`` names it
    │       ├── ShardMissingError   listed in the manifest, absent from storage
    │       ├── ShardDigestError    stored or raw bytes do not match the manifest digest
    │       └── ShardFormatError    truncated, wrong size, wrong schema or dtype
    ├── StorageError                an fsspec backend failed (``.retryable`` says if retrying may help)
    ├── PublishError                a new version could not be published; nothing was changed
    │   ├── WriteConflictError      another writer changed the object between our read and our write
    │   └── RollbackError           publishing would move a destination back along the parent chain
    ├── StateError                  loader state does not match this loader (dataset, seed, seq_len)
    ├── CacheError                  the node-local shard cache cannot be written or read; ``.path`` names it
    ├── ConfigError                 invalid ferry.toml
    ├── ReplicationError            a replication action failed (``.retryable``)
    │   ├── SourceMissing           the source replica lacks the shard (not retryable there)
    │   └── LeaseHeldError          another writer holds the destination's lease (``.holder``)
    ├── Cancelled                   the action was stopped (daemon shutdown); nothing was written
    └── ServiceError                the ferry service answered with an error (``.status``)

Library exceptions are mapped at the boundary with ``raise XError(...) from exc``.

Every error says whether trying the same action again may help (``.retryable``, rclone ``fserrors``
style): False unless the class or the instance says otherwise. Corrupt or truncated bytes
(ShardDigestError, ShardFormatError) are retryable: the next read or another replica may be good.
The replication executor decides retry / give up on a source / stop from this alone.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "FerryError",
    "UsageError",
    "NotFoundError",
    "InvalidValueError",
    "InputFormatError",
    "MegatronIndexError",
    "TokenRangeError",
    "DatasetError",
    "DatasetNotFoundError",
    "ManifestError",
    "ShardError",
    "ShardMissingError",
    "ShardDigestError",
    "ShardFormatError",
    "StorageError",
    "PublishError",
    "WriteConflictError",
    "RollbackError",
    "StateError",
    "CacheError",
    "ConfigError",
    "ReplicationError",
    "SourceMissing",
    "Cancelled",
    "LeaseHeldError",
    "ServiceError",
]


class FerryError(Exception):
    """Base of every error ferry raises on purpose."""

    exit_code = 1
    #: whether trying the same action again may help (an instance may say otherwise)
    retryable: bool = False


class UsageError(FerryError):
    """Bad arguments or options."""

    exit_code = 2


class NotFoundError(UsageError):
    """The request names a dataset, cluster, link or error id that is not known (the API answers 404)."""


class InvalidValueError(UsageError, ValueError):
    """An argument has an acceptable type but a value outside what it may be (a NaN, infinite or 2**80
    mixing weight, a negative step): ``except ValueError`` catches it as well as ``except UsageError``."""


class InputFormatError(FerryError):
    """An input file cannot be read as the format it claims to be."""


class MegatronIndexError(InputFormatError):
    """A Megatron ``.idx`` file has a wrong magic, version, dtype code or layout."""


class TokenRangeError(FerryError):
    """A token id is negative or not below the declared vocabulary size."""


class DatasetError(FerryError):
    """A dataset cannot be read or trusted."""


class DatasetNotFoundError(DatasetError):
    """No ``manifest.json`` at the given URL."""


class ManifestError(DatasetError):
    """The manifest (or its shard table) is malformed or does not match its digest."""


class ShardError(DatasetError):
    """One shard is bad. ``shard`` is its path relative to the dataset root."""

    def __init__(self, shard: str, message: str) -> None:
        super().__init__(f"shard {shard}: {message}")
        self.shard = shard
        self.reason = message

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        # Exceptions pickle as cls(*args); ours take (shard, message), so say so (process pools).
        return (type(self), (self.shard, self.reason))


class ShardMissingError(ShardError):
    """A shard listed in the manifest does not exist in storage."""


class ShardDigestError(ShardError):
    """A shard's bytes do not match the digest recorded in the manifest."""

    retryable = True


class ShardFormatError(ShardError):
    """A shard is truncated, has the wrong size, schema or dtype."""

    retryable = True


class StorageError(FerryError):
    """An fsspec backend failed. ``retryable`` is True when trying again may help."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"retryable": self.retryable}))


class PublishError(FerryError):
    """A new dataset version could not be published; the dataset is unchanged."""


class WriteConflictError(PublishError):
    """Another writer changed the object between our read and our conditional write."""


class RollbackError(PublishError):
    """Publishing would replace a destination's version with one that does not descend from it."""


class StateError(FerryError):
    """A loader state dict does not match the loader it is loaded into."""


class CacheError(FerryError):
    """The node-local shard cache failed (full disk, read-only or missing directory). ``path`` names the file.

    Not a DatasetError: the dataset is fine, this node's cache directory is not.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"path": self.path}))


class ConfigError(FerryError):
    """A ferry.toml (or equivalent mapping) is invalid."""

    exit_code = 2


class ReplicationError(FerryError):
    """A replication action failed. ``retryable`` is False for errors a retry cannot fix."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"retryable": self.retryable}))


class SourceMissing(ReplicationError):
    """The source replica does not hold the shard: no retry there can help (another source may)."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message, retryable=retryable)


class Cancelled(FerryError):  # a control-flow signal more than a failure
    """The action was stopped (daemon shutdown); nothing was written at the final name."""

    def __init__(self, message: str = "stopped") -> None:
        super().__init__(message)


class LeaseHeldError(ReplicationError):
    """Another writer holds the destination's lease. ``holder`` names it (kind:host:pid:id)."""

    def __init__(self, message: str, *, holder: str = "", retryable: bool = False) -> None:
        super().__init__(message, retryable=retryable)
        self.holder = holder

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"holder": self.holder, "retryable": self.retryable}))


class ServiceError(FerryError):
    """The ferry service answered with an error status."""

    def __init__(self, message: str, *, status: int = 0) -> None:
        super().__init__(message)
        self.status = status

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), str(self), {"status": self.status}))


def _rebuild(cls: type[FerryError], message: str, kwargs: dict[str, Any]) -> FerryError:
    """Unpickle an error whose constructor takes keyword-only options (process pools, Ray)."""
    return cls(message, **kwargs)
