"""The daemon beside other writers: another writer's lease, and a destination that is ahead.

Before issue 13 the daemon published over a destination another writer was filling, and moved
a destination that had been appended to back to the source's older version.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import pack, running_service, wait_until

from ferry.service.replication.engine import Engine
from ferry.service.replication.lease import Lease
from ferry.service.replication.state import State
from ferry.service.transfer.executor import Executor
from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.storage.store import resolve


def test_daemon_stays_out_while_another_writer_holds_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_service(tmp_path, monkeypatch) as svc:
        dest = resolve(svc.west("corpus"))
        other = Lease(dest, "sync")
        other.acquire()  # another writer (a ferry sync, say) is filling west/corpus
        try:
            pack(svc.east("corpus"))
            status = wait_until(lambda: (s := svc.client.status()).other_writers and s, what="the other writer seen")
            [seen] = status.other_writers
            assert (seen.dataset, seen.cluster, seen.holder) == ("corpus", "west", other.holder)
            errors = wait_until(svc.client.errors, what="an open error")
            assert any("is being written by sync" in e.reason for e in errors)
            assert not dest.exists("manifest.json")  # nothing published over the other writer
        finally:
            other.release()
        wait_until(lambda: svc.west_version("corpus"), what="the daemon's publish once the lease is free")
        wait_until(lambda: not svc.client.status().other_writers, what="other_writers cleared")
        assert svc.client.errors() == []


def test_daemon_refuses_to_move_a_destination_back_and_does_not_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    east, west = tmp_path / "east" / "corpus", tmp_path / "west" / "corpus"
    pack(str(east))
    engine = Engine(Executor(transfers=2), State(None))
    assert engine.sync_pass("corpus", "e", "w", {"e": resolve(str(east)), "w": resolve(str(west))}).published
    ahead = pack(str(west), seed=7, append=True)  # west moves ahead of east (an append made there)
    with running_service(tmp_path, monkeypatch) as svc:
        errors = wait_until(svc.client.errors, what="the refusal as an open error")
        [error] = errors
        assert "refusing to publish" in error.reason and error.cluster == "west" and not error.retryable
        passes = svc.daemon.passes
        wait_until(lambda: svc.daemon.passes >= passes + 3, what="three more polls")
        assert [e.id for e in svc.client.errors()] == [error.id]
        events = [h for h in svc.daemon.state.history(limit=100) if h.dataset == "corpus"]
        assert events == []  # no copy was attempted
        assert load_manifest(resolve(str(west))).version_id == ahead.version_id  # west stays ahead
