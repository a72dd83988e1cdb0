"""``[transfer]``: the keys, their checks, and what the Ray engine's parts do without a Ray cluster
(the governor's limits, cancel and progress; the error when Ray is missing)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from configs import Cluster, FerryToml, Rule, Transfer

from ferry.service.config import parse_config
from ferry.service.config_types import TransferConfig
from ferry.service.transfer.bandwidth import Bandwidth
from ferry.service.transfer.copier import ThreadCopier, make_copier
from ferry.service.transfer.governor import GRANT_SECONDS, UNLIMITED_GRANT, Governor
from ferry.service.transfer.ray_tasks import portable
from ferry.shard_tools.errors import ConfigError, ShardDigestError, StorageError, UsageError
from ferry.shard_tools.format.digest import Hasher
from ferry.shard_tools.storage.store import resolve


def _doc(tmp_path: Path, transfer: Transfer | None, dst: str | None = None) -> dict:
    clusters = {"a": Cluster(tmp_path / "a"), "b": Cluster(dst or tmp_path / "b")}
    return FerryToml(clusters=clusters, rules=[Rule("a", ["b"])], transfer=transfer).doc()


def test_transfer_defaults_to_threads(tmp_path: Path) -> None:
    assert parse_config(_doc(tmp_path, None)).transfer == TransferConfig()
    assert TransferConfig().engine == "threads"


def test_transfer_ray_keys(tmp_path: Path) -> None:
    got = parse_config(_doc(tmp_path, Transfer(engine="ray", address="ray://head:10001", max_retries=5,
                                               task_cpus=0.5, node_bwlimit="100MiB/s"))).transfer  # fmt: skip
    assert got == TransferConfig("ray", "ray://head:10001", 5, 0.5, 100 * 1024 * 1024)
    assert (
        parse_config(_doc(tmp_path, Transfer(engine="ray", address="10.0.0.1:6380"))).transfer.address
        == "10.0.0.1:6380"
    )


@pytest.mark.parametrize(
    ("transfer", "message"),
    [
        (Transfer(engine="dask"), "transfer.engine"),
        (Transfer(address="http://head:80"), "transfer.address: expected"),
        (Transfer(address="ray://head"), "transfer.address: expected"),
        (Transfer(address="head:99999"), "transfer.address: expected"),
        (Transfer(max_retries=-1), "transfer.max_retries: must be >= 0"),
        (Transfer(node_bwlimit="fast"), "transfer.node_bwlimit"),
    ],
)
def test_transfer_errors_name_the_key(tmp_path: Path, transfer: Transfer, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(_doc(tmp_path, transfer))


def test_ray_engine_refuses_a_cluster_in_memory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot see cluster 'b'"):
        parse_config(_doc(tmp_path, Transfer(engine="ray"), dst="memory://here"))
    assert parse_config(_doc(tmp_path, Transfer(engine="threads"), dst="memory://here")).transfer.engine == "threads"


def test_ray_engine_without_ray_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(UsageError, match=r"needs Ray.*ferry-data\[ray\]"):
        make_copier(TransferConfig(engine="ray"), Bandwidth())
    assert isinstance(make_copier(TransferConfig(), Bandwidth()), ThreadCopier)


def test_governor_grants_under_every_limit() -> None:
    gov = Governor((None, {"a->b": None}, None))
    assert gov.grant("t1", "a->b", "n1", 1000, 0) == (UNLIMITED_GRANT, False)  # no limit: a lasting grant
    gov.set_rates((None, {"a->b": 512 * 1024}, None))
    t0 = time.monotonic()
    for _ in range(8):  # 1 MiB under 512 KiB/s (a quarter second of burst): about 1.75 s
        assert gov.grant("t1", "a->b", "n1", 128 * 1024, 128 * 1024) == (128 * 1024, False)
    assert time.monotonic() - t0 > 1.2  # the limit holds (a copy that waits too long fails on the test timeout)
    # a small ask gets GRANT_SECONDS of the rate: few calls whatever the step the copy moves in
    assert gov.grant("t1", "a->b", "n1", 1024, 0) == (int(512 * 1024 * GRANT_SECONDS), False)
    assert gov.moved("t1") == 1024 * 1024 and gov.transfers_by_node() == {"n1": 1}
    assert gov.rates() == (None, {"a->b": 512 * 1024}, None)
    gov.forget("t1")
    assert gov.moved("t1") == 0


def _two_nodes_pull(gov: Governor, size: int) -> dict[str, float]:
    """Seconds each of two nodes, pulling at once, takes to be granted ``size`` bytes."""
    took: dict[str, float] = {}

    def pull(node: str) -> None:
        t0 = time.monotonic()
        got = 0
        while got < size:
            got += gov.grant(node, "x->y", node, 16 * 1024, 0)[0]
        took[node] = time.monotonic() - t0

    threads = [threading.Thread(target=pull, args=(n,)) for n in ("n1", "n2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(took) == {"n1", "n2"}, took
    return took


def test_governor_limits_each_node_on_its_own() -> None:
    rate = 256 * 1024
    own = _two_nodes_pull(Governor((None, {}, rate)), 512 * 1024)  # a bucket per node
    shared = _two_nodes_pull(Governor((None, {"x->y": rate}, None)), 512 * 1024)  # one bucket for both
    # both limits hold: a node's 512 KiB at 256 KiB/s, and the shared link's 1 MiB, less a burst each
    assert min(own.values()) > 1.2 and max(shared.values()) > 3.2, (own, shared)
    # each node draws from its own bucket: both finish in about the time one takes alone, half the shared time
    # (a ratio against the shared run beside it, not a bound in seconds: a loaded machine slows both alike)
    assert max(own.values()) < 0.75 * max(shared.values()), (own, shared)


def test_governor_cancel_reaches_waiting_and_later_grants() -> None:
    gov = Governor((1024.0, {}, None))  # 1 KiB/s: a 1 MiB grant would wait for minutes
    got: list[tuple[int, bool]] = []
    waiter = threading.Thread(target=lambda: got.append(gov.grant("t", "a->b", "n", 1 << 20, 0)))
    waiter.start()
    time.sleep(0.3)
    gov.cancel()
    waiter.join(5)
    assert not waiter.is_alive() and got[0][1] is True
    assert gov.grant("t2", "a->b", "n", 10, 5) == (0, True) and gov.report("t2", 1) is True


def test_thread_copier_copies_under_this_nodes_limit(tmp_path: Path) -> None:
    data = os.urandom(512 * 1024)
    (tmp_path / "a" / "shards").mkdir(parents=True)
    (tmp_path / "a" / "shards" / "x").write_bytes(data)
    hasher = Hasher()
    hasher.update(data)
    copier = ThreadCopier(Bandwidth(node_rate=256 * 1024), chunk_size=64 * 1024)
    t0 = time.monotonic()
    copier.copy(resolve(str(tmp_path / "a")), resolve(str(tmp_path / "b")), "shards/x", len(data), hasher.hexdigest(),
                create_only=True, link="a->b", progress=lambda n: None, cancel=threading.Event())  # fmt: skip
    assert time.monotonic() - t0 > 1.2  # 512 KiB at 256 KiB/s, less a quarter second of burst
    assert (tmp_path / "b" / "shards" / "x").read_bytes() == data
    assert copier.verify(resolve(str(tmp_path / "b")), "shards/x", len(data), hasher.hexdigest(),
                         cancel=threading.Event()) is None  # fmt: skip


def test_a_refusal_travels_as_not_retryable() -> None:
    refused = StorageError("cannot read")
    refused.__cause__ = PermissionError(13, "denied")
    assert portable(refused).retryable is False
    corrupt = ShardDigestError("shards/x", "mismatch")
    assert portable(corrupt) is corrupt and corrupt.retryable
    odd = ShardDigestError("shards/y", "mismatch")
    odd.__cause__ = PermissionError(13, "denied")
    assert isinstance(portable(odd), StorageError) and not portable(odd).retryable


def test_ray_engine_with_nothing_at_its_address_says_so_at_once() -> None:
    pytest.importorskip("ray")
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(UsageError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        make_copier(TransferConfig(engine="ray", address=f"127.0.0.1:{port}"), Bandwidth())
    assert time.monotonic() - t0 < 10


def test_ray_engine_errors_name_the_setting_that_chose_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``ferry serve`` is told its config keys, ``ferry sync`` its flags."""
    pytest.importorskip("ray")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = TransferConfig(engine="ray", address=f"127.0.0.1:{port}")
    with pytest.raises(UsageError, match=r'^\[transfer\] engine = "ray": .* or fix \[transfer\] address$'):
        make_copier(config, Bandwidth())
    with pytest.raises(UsageError, match=r"^--engine ray: .* or fix --ray-address$"):
        make_copier(config, Bandwidth(), from_flags=True)
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed
    with pytest.raises(UsageError, match=r"^--engine ray needs Ray, an optional extra"):
        make_copier(config, Bandwidth(), from_flags=True)
