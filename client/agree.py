"""The ranks of a ``torch.distributed`` job read one version of each dataset: rank 0's.

Each rank opens the dataset's current version as it would alone. Rank 0 publishes its version in the
process group's key-value store; every other rank re-opens at that version if its own differs (through
``versions/<id>.json``, from whichever of its replicas has it) and answers ok or why not; rank 0
gathers the answers and publishes a verdict, and every rank raises the same ``DatasetError`` when any
rank failed or did not answer. The store, not a collective: it needs no tensors and no device (the same
with gloo and nccl), each wait on it is bounded by the process group's timeout, and a rank that builds
other datasets or none is named in an error rather than leaving the others in a collective that never
ends. Datasets are matched by the order each rank builds them in (the n-th agreeing dataset of every
rank), as a collective would; pinned ones (``version=``) and DataLoader workers take no part.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch.utils.data import get_worker_info

from ferry.shard_tools.errors import DatasetError, FerryError
from ferry.shard_tools.format.manifest import Manifest

__all__ = ["agreed_manifest", "Agreement"]

Load = Callable[[str | None], Manifest]
_PREFIX = "ferry/version"
_SEQUENCE = itertools.count()  # this process's agreeing datasets, in the order they are built
_FEW = 4  # ranks named in one message


def agreed_manifest(load: Load, names: Sequence[str], version: str | None = None) -> Manifest:
    """``load(version)``; unpinned under ``torch.distributed`` (world size > 1), the version rank 0 read.

    ``names``: the replicas' URLs as errors show them. Outside a distributed job, in a DataLoader worker,
    or with ``version`` given, this is ``load(version)`` and costs nothing more."""
    group = None if version is not None else _group()
    if group is None:
        return load(version)
    store, rank, world = group
    n = next(_SEQUENCE)
    what = f"dataset #{n + 1} ({', '.join(names)})"
    return Agreement(store, f"{_PREFIX}/{n}/", rank, world, store.timeout, what).run(load)


def _group() -> tuple[Any, int, int] | None:
    """The default process group's store, rank and world size; None where there is nothing to agree on."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or get_worker_info() is not None:
        return None  # a DataLoader worker has its parent's dataset, version chosen
    world = dist.get_world_size()
    if world < 2:
        return None
    return dist.distributed_c10d._get_default_store(), dist.get_rank(), world


class Agreement:
    """One dataset's agreement: keys ``<prefix>v`` (rank 0's version), ``<prefix>a<r>`` (rank r's answer),
    ``answered``/``failed`` (counts), ``done`` (every rank answered) and ``verdict`` (rank 0's conclusion)."""

    def __init__(self, store: Any, prefix: str, rank: int, world: int, timeout: timedelta, what: str) -> None:
        self.store, self.prefix, self.rank, self.world = store, prefix, rank, world
        self.timeout, self.what = timeout, what

    def run(self, load: Load) -> Manifest:
        try:
            return self._lead(load) if self.rank == 0 else self._follow(load)
        except torch.distributed.DistError as exc:  # the store itself failed (its host is gone)
            raise DatasetError(
                f"rank {self.rank} lost the process group's store while the ranks agreed on the version of "
                f"{self.what}: {exc}"
            ) from None

    # --- rank 0 ----------------------------------------------------------------------------------------------

    def _lead(self, load: Load) -> Manifest:
        try:
            manifest = load(None)
        except Exception as exc:
            self._set("v", {"error": f"{type(exc).__name__}: {exc}"})  # the others fail now, not at a timeout
            raise
        self._set("v", {"version": manifest.version_id})
        error = self._gather(manifest.version_id)
        self._set("verdict", {"error": error})
        if error is not None:
            raise DatasetError(error)
        return manifest

    def _gather(self, version: str) -> str | None:
        """What went wrong on the other ranks (None: every one reads ``version`` now)."""
        seconds = self.timeout.total_seconds()
        try:
            self.store.wait([self._key("done")], self.timeout)
        except torch.distributed.DistStoreError:
            silent = [r for r in range(1, self.world) if not self.store.check([self._key(f"a{r}")])]
            if silent:
                return (
                    f"{_ranks(silent)} did not answer within {seconds:g} s (the process group's timeout) when the "
                    f"ranks agreed on the version of {self.what}; rank 0 read {version}. Every rank must build the "
                    "same datasets in the same order; pass agree_version=False (or version=) to one built on some "
                    "ranks only"
                )
        if not int(self.store.add(self._key("failed"), 0)):
            return None
        errors = []
        for r in range(1, self.world):
            answer = self._get(f"a{r}")
            if answer["error"] is not None:
                errors.append(answer["error"])
                if len(errors) == _FEW:
                    break
        failed = int(self.store.add(self._key("failed"), 0))
        more = f"; and {failed - len(errors)} more" if failed > len(errors) else ""
        return f"the ranks cannot all read version {version} of {self.what}: " + "; ".join(errors) + more

    # --- the other ranks -------------------------------------------------------------------------------------

    def _follow(self, load: Load) -> Manifest:
        own: Manifest | None = None
        own_error: FerryError | None = None
        try:
            own = load(None)
        except FerryError as exc:
            own_error = exc  # this rank may still read rank 0's version
        lead = self._wait("v", self.timeout, "rank 0 published no version of")
        if "error" in lead:
            raise DatasetError(f"rank 0 cannot open {self.what}: {lead['error']}")
        version = lead["version"]
        manifest, error = own, None
        if own is None or own.version_id != version:
            try:
                manifest = load(version)
            except FerryError as exc:
                here = f"its current version is {own.version_id}" if own else f"it cannot open any version: {own_error}"
                error = (
                    f"rank {self.rank} cannot read version {version} that rank 0 read ({here}): {exc}; let its "
                    f"replicas catch up with rank 0's, or pin version= on every rank"
                )
        self._answer(error)
        verdict = self._wait("verdict", 2 * self.timeout, "rank 0 gave no verdict on the version of")
        if verdict["error"] is not None:
            raise DatasetError(verdict["error"])
        assert manifest is not None  # no error: this rank read rank 0's version
        return manifest

    def _answer(self, error: str | None) -> None:
        if error is not None:
            self.store.add(self._key("failed"), 1)  # counted before the answer is seen, and before "done"
        self._set(f"a{self.rank}", {"error": error})
        if int(self.store.add(self._key("answered"), 1)) == self.world - 1:
            self._set("done", {})

    def _wait(self, name: str, timeout: timedelta, what: str) -> dict[str, Any]:
        try:
            self.store.wait([self._key(name)], timeout)
        except torch.distributed.DistStoreError:
            raise DatasetError(
                f"{what} {self.what} within {timeout.total_seconds():g} s: rank 0 is stuck, gone, or builds other "
                "datasets; every rank must build the same datasets in the same order (agree_version=False or "
                "version= for one built on some ranks only)"
            ) from None
        return self._get(name)

    # --- the store -------------------------------------------------------------------------------------------

    def _key(self, name: str) -> str:
        return self.prefix + name

    def _set(self, name: str, value: dict[str, Any]) -> None:
        self.store.set(self._key(name), json.dumps(value))

    def _get(self, name: str) -> dict[str, Any]:
        value: dict[str, Any] = json.loads(self.store.get(self._key(name)))
        return value


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(str(r) for r in ranks[:_FEW])
    more = f" and {len(ranks) - _FEW} more" if len(ranks) > _FEW else ""
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}{more}"
