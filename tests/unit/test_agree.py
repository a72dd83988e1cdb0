"""The version agreement between ranks, each rank a thread over one real c10d HashStore (fast, no torchrun).

The multi-process run is tests/integration/test_rank_versions.py; here are the failure paths that need
many ranks or a rank 0 that cannot open the dataset.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from scripts.loader_common import pack_test_dataset

from ferry.client.agree import Agreement, agreed_manifest
from ferry.client.fetching.replicas import Replicas
from ferry.shard_tools.errors import DatasetError, DatasetNotFoundError
from ferry.shard_tools.format.manifest import Manifest

TIMEOUT = timedelta(seconds=2)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("agree")
    new, old = str(root / "new"), str(root / "old")
    pack_test_dataset(new, 60)
    shutil.copytree(new, old)
    pack_test_dataset(new, 20, seed=1, append=True)
    return {"new": new, "old": old, "none": str(root / "none")}


def _agree(loads: list[Callable[[str | None], Manifest] | None]) -> list[Any]:
    """Run rank r's agreement with ``loads[r]`` in a thread per rank (None: that rank never takes part);
    each result is the manifest read or the exception raised."""
    store = dist.HashStore()
    results: list[Any] = [None] * len(loads)

    def rank(r: int, load: Callable[[str | None], Manifest]) -> None:
        try:
            results[r] = Agreement(store, "t/", r, len(loads), TIMEOUT, "dataset #1 (ds)").run(load)
        except Exception as exc:  # noqa: BLE001 — the test looks at it
            results[r] = exc

    threads = [threading.Thread(target=rank, args=(r, f)) for r, f in enumerate(loads) if f is not None]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "an agreement did not end within its bound"
    return results


def _load(url: str) -> Callable[[str | None], Manifest]:
    return Replicas(url).load_manifest


def test_every_rank_gets_rank0s_version(replicas: dict[str, Any]) -> None:
    old = Replicas(replicas["old"]).load_manifest().version_id
    results = _agree([_load(replicas["old"]), _load(replicas["new"]), _load(replicas["old"])])
    assert [m.version_id for m in results] == [old, old, old]


def test_rank0_that_cannot_open_the_dataset_fails_the_others_at_once(replicas: dict[str, Any]) -> None:
    results = _agree([_load(replicas["none"]), _load(replicas["new"]), _load(replicas["old"])])
    assert isinstance(results[0], DatasetNotFoundError)
    for r in (1, 2):  # told by rank 0, not by a timeout
        assert isinstance(results[r], DatasetError) and "rank 0 cannot open" in str(results[r]), results[r]
        assert "DatasetNotFoundError" in str(results[r])


def test_many_failing_ranks_are_counted_and_a_few_named(replicas: dict[str, Any]) -> None:
    results = _agree([_load(replicas["new"]), *[_load(replicas["old"]) for _ in range(6)]])
    assert all(isinstance(r, DatasetError) for r in results), results
    message = str(results[0])
    assert all(str(r) == message for r in results)  # the same verdict on every rank
    assert message.count("cannot read version") == 4 and "and 2 more" in message, message


def test_a_rank_that_never_answers_is_named_on_every_rank(replicas: dict[str, Any]) -> None:
    results = _agree([_load(replicas["old"]), None, _load(replicas["old"]), None])
    for r in (0, 2):
        assert isinstance(results[r], DatasetError), results[r]
        assert "ranks 1, 3 did not answer within 2 s" in str(results[r]), results[r]


def test_rank0_that_never_publishes_is_a_timeout_on_the_others(replicas: dict[str, Any]) -> None:
    results = _agree([None, _load(replicas["old"])])
    assert isinstance(results[1], DatasetError) and "rank 0 published no version" in str(results[1]), results[1]


def test_without_a_process_group_it_is_one_plain_load(replicas: dict[str, Any]) -> None:
    assert not dist.is_initialized()
    calls: list[str | None] = []

    def load(version: str | None) -> Manifest:
        calls.append(version)
        return Replicas(replicas["old"]).load_manifest(version)

    current = agreed_manifest(load, ["ds"])
    agreed_manifest(load, ["ds"], current.version_id)
    assert calls == [None, current.version_id]
