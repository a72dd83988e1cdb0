"""The stager on real files: stages a job's coming shards verified and within the budget, evicts what the job
passed, adopts (and re-checks) what an earlier run staged, and never evicts a shard whose cluster copy is gone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import pack

from ferry.client.service.job_types import Heartbeat, JobPhase, Registration, SourcePlan
from ferry.service.config_types import Cluster, StagingConfig
from ferry.service.jobs.registry import JobRegistry
from ferry.service.jobs.stager import Stager
from ferry.shard_tools.dataset import open_dataset
from ferry.shard_tools.format.digest import digest_bytes
from ferry.shard_tools.storage.store import temp_name


@pytest.fixture
def world(tmp_path: Path) -> tuple[Path, Path, list[tuple[str, int, str]]]:
    """A dataset on cluster west (seq_len 1, shuffle none: positions walk the shards in order)."""
    west = tmp_path / "west"
    res = pack(str(west / "corpus"), 120, shard_size=4096)
    t = open_dataset(str(west / "corpus")).manifest.shards
    shards = [(t.paths[i], int(t.stored_bytes[i]), t[i].stored_digest) for i in range(len(t))]
    assert len(shards) >= 8
    (tmp_path / "version").write_text(res.version_id)
    return west, tmp_path / "staging", shards


_STAGERS: list[Stager] = []


@pytest.fixture(autouse=True)
def _stop_stagers() -> Iterator[None]:
    """Each test's stagers stop after it (their lease threads end, the leases are released)."""
    yield
    while _STAGERS:
        _STAGERS.pop().stop()


def start(
    world: tuple[Path, Path, list[tuple[str, int, str]]], budget: int, horizon: int, interval: float = 2.0
) -> tuple[JobRegistry, Stager]:
    west, staging, _ = world
    registry = JobRegistry(lambda: [("west", str(west))])
    config = StagingConfig(str(staging), budget, horizon, interval)
    stager = Stager(registry, config, {"west": Cluster("west", str(west))})
    _STAGERS.append(stager)
    return registry, stager


def register(registry: JobRegistry, west: Path, version: str) -> str:
    source = SourcePlan([str(west / "corpus")], version, "0", "none", 1, "tokens", 1)
    return registry.register(Registration("train", 0, 1, 1, [source], [JobPhase(0, [1])], heartbeat_s=60)).id


def register_at(registry: JobRegistry, west: Path, version: str, position: int) -> str:
    """A job registered, then at ``position`` (its heartbeat)."""
    job = register(registry, west, version)
    registry.heartbeat(job, Heartbeat(position=position, epoch=0, samples_per_second=1.0))
    return job


def staged_files(staging: Path) -> dict[str, bytes]:
    root = staging / "corpus"
    return {f.relative_to(root).as_posix(): f.read_bytes() for f in root.rglob("*") if f.is_file()}


def position_of_shard(west: Path, k: int) -> int:
    """The first stream position (seq_len 1) whose sample lies in shard ``k``."""
    t = open_dataset(str(west / "corpus")).manifest.shards
    return int(t.token_offsets[k])


def test_stage_in_order_within_budget_evict_passed_and_adopt_after_restart(
    world: tuple[Path, Path, list[tuple[str, int, str]]],
) -> None:
    west, staging, shards = world
    version = (west.parent / "version").read_text()
    sizes = [s for _, s, _ in shards]
    budget, horizon = sum(sizes[:4]), sum(sizes[:3])
    registry, stager = start(world, budget, horizon)
    job = register(registry, west, version)
    stager.step()
    files = staged_files(staging)
    assert set(files) == {p for p, _, _ in shards[:3]}  # the first shards it reads, for `horizon` bytes
    assert all(digest_bytes(files[p]) == d for p, _, d in shards[:3])
    assert sum(len(b) for b in files.values()) <= budget
    assert stager.staged_ahead(job) == sum(sizes[:3]) and stager.missing(job) == 0

    registry.heartbeat(job, Heartbeat(position=position_of_shard(west, 4), epoch=0, samples_per_second=1.0))
    stager.step()
    files = staged_files(staging)
    assert set(files) == {p for p, _, _ in shards[4:7]}  # passed shards evicted, the next ones staged

    # a restart: the new stager adopts what is there (one copy damaged meanwhile: removed and staged again)
    damaged = staging / "corpus" / shards[5][0]
    damaged.write_bytes(b"x" * len(damaged.read_bytes()))
    stager.stop()  # the daemon stops (and gives the staging location up)
    registry2, stager2 = start(world, budget, horizon)
    job2 = register(registry2, west, version)
    registry2.heartbeat(job2, Heartbeat(position=position_of_shard(west, 4), epoch=0, samples_per_second=1.0))
    stager2.step()
    assert set(stager2.staged()) == {("corpus", p) for p, _, _ in shards[4:7]}
    assert digest_bytes((staging / "corpus" / shards[5][0]).read_bytes()) == shards[5][2]


def test_a_shard_whose_cluster_copy_is_gone_is_never_evicted(
    world: tuple[Path, Path, list[tuple[str, int, str]]],
) -> None:
    west, staging, shards = world
    version = (west.parent / "version").read_text()
    sizes = [s for _, s, _ in shards]
    registry, stager = start(world, sum(sizes), sizes[0])
    job = register(registry, west, version)
    stager.step()
    assert set(staged_files(staging)) == {shards[0][0]}
    (west / "corpus" / shards[0][0]).unlink()  # staging now holds the only copy
    registry.heartbeat(job, Heartbeat(position=position_of_shard(west, 3), epoch=0, samples_per_second=1.0))
    stager.step()
    assert shards[0][0] in staged_files(staging)  # passed, yet kept: it is the only copy


def test_the_staging_section_is_checked(tmp_path: Path) -> None:
    from configs import Cluster as ClusterToml
    from configs import FerryToml, Rule, Staging

    from ferry.service.config import parse_config
    from ferry.shard_tools.errors import ConfigError

    def parse(staging: Staging) -> StagingConfig | None:
        toml = FerryToml(clusters={"a": ClusterToml(tmp_path / "a"), "b": ClusterToml(tmp_path / "b")},
                         rules=[Rule("a", ["b"])], staging=staging)  # fmt: skip
        return parse_config(toml.doc(), base_dir=tmp_path).staging

    got = parse(Staging("fast", "2GiB", "512MiB"))
    assert got == StagingConfig(str(tmp_path / "fast"), 2 * 2**30, 512 * 2**20)
    for url in (tmp_path / "a" / "staging", tmp_path):  # inside a cluster, or holding one
        with pytest.raises(ConfigError, match="outside every cluster"):
            parse(Staging(str(url), "1GiB", "1GiB"))
    with pytest.raises(ConfigError, match="staging.budget"):
        parse(Staging("fast", "lots", "1GiB"))
    with pytest.raises(ConfigError, match="staging.horizon"):
        parse(Staging("fast", "1GiB", 0))


def test_a_plan_no_loader_could_have_is_left_out_and_the_others_are_staged(
    world: tuple[Path, Path, list[tuple[str, int, str]]],
) -> None:
    west, staging, shards = world
    version = (west.parent / "version").read_text()
    registry, stager = start(world, sum(s for _, s, _ in shards), shards[0][1])
    source = SourcePlan([str(west / "corpus")], version, "0", "none", 1, "tokens", 1)
    bad = Registration("bad", 0, 1, 1, [source], [JobPhase(0, [1]), JobPhase(0, [1])], heartbeat_s=60)
    registry.register(bad)  # two phases at 0: Schedule refuses it, and so would every round without the check
    register(registry, west, version)
    stager.step()
    assert set(staged_files(staging)) == {shards[0][0]}


def test_a_temp_file_left_by_a_killed_copy_is_removed_and_a_live_writers_kept(
    world: tuple[Path, Path, list[tuple[str, int, str]]],
) -> None:
    """A daemon killed while it staged leaves its copy's temp file: the next stager removes it when it adopts
    what staging holds; a temp file whose writer still runs (this process) stays."""
    west, staging, shards = world
    version = (west.parent / "version").read_text()
    target = shards[-1][0]  # a shard the job does not read within its horizon: only the sweep touches its folder
    code = f"from ferry.shard_tools.storage.store import temp_name; print(temp_name({target!r}))"
    dead = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    live = temp_name(target)
    for name in (dead, live):
        (staging / "corpus" / name).parent.mkdir(parents=True, exist_ok=True)
        (staging / "corpus" / name).write_bytes(b"half a shard")
    registry, stager = start(world, sum(s for _, s, _ in shards), shards[0][1])
    register(registry, west, version)
    stager.step()
    left = set(staged_files(staging))
    assert dead not in left and live in left
    assert shards[0][0] in left  # and staging went on


def test_a_second_daemon_on_the_same_staging_location_stages_nothing_until_the_first_stops(
    world: tuple[Path, Path, list[tuple[str, int, str]]], caplog: pytest.LogCaptureFixture
) -> None:
    west, staging, shards = world
    version = (west.parent / "version").read_text()
    sizes = [s for _, s, _ in shards]
    first_registry, first = start(world, sum(sizes), sizes[0])
    register(first_registry, west, version)
    first.step()
    assert set(staged_files(staging)) == {shards[0][0]}
    registry, second = start(world, sum(sizes), sum(sizes[:3]))
    job = register(registry, west, version)
    with caplog.at_level("ERROR", logger="ferry.staging"):
        assert second.step().stage == [] and second.step().stage == []
    assert set(staged_files(staging)) == {shards[0][0]}  # the second stages and evicts nothing
    assert second.held_by_other is not None and second.staged_ahead(job) is None
    assert [r.getMessage() for r in caplog.records].count(
        f"staging: off: another daemon stages into this location: {second.held_by_other}"
    ) == 1  # said once, not every round
    first.stop()
    second.step()
    assert set(staged_files(staging)) == {p for p, _, _ in shards[:3]} and second.held_by_other is None
    second.stop()


def test_a_lease_file_that_is_not_one_never_blocks_staging(
    world: tuple[Path, Path, list[tuple[str, int, str]]],
) -> None:
    west, staging, shards = world
    version = (west.parent / "version").read_text()
    staging.mkdir(parents=True, exist_ok=True)
    (staging / ".ferry-lease.json").write_bytes(b"\x00not a lease")
    registry, stager = start(world, sum(s for _, s, _ in shards), shards[0][1])
    register(registry, west, version)
    stager.step()
    assert set(staged_files(staging)) == {shards[0][0]} and stager.held_by_other is None


def test_a_registration_is_staged_for_at_once_not_after_the_interval(
    world: tuple[Path, Path, list[tuple[str, int, str]]],
) -> None:
    """A job's first reads come soon after its loader registers: the stager plans then, not ``interval`` later."""
    west, staging, shards = world
    version = (west.parent / "version").read_text()
    registry, stager = start(world, sum(s for _, s, _ in shards), shards[0][1], interval=600.0)
    stager.start()
    deadline = time.monotonic() + 10
    while stager.rounds < 1 and time.monotonic() < deadline:  # the first round (no job yet) is over
        time.sleep(0.01)
    assert stager.rounds >= 1
    register(registry, west, version)
    while stager.rounds < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert set(staged_files(staging)) == {shards[0][0]}


def test_a_job_registering_within_a_round_has_its_first_shards_staged_before_the_others_later_ones(
    world: tuple[Path, Path, list[tuple[str, int, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The round staging one job's shards plans again when a second job registers: the second job's first
    shard is among the next copies started, not after every shard the first job reads later."""
    from ferry.service.jobs import stager as stager_module

    west, staging, shards = world
    version = (west.parent / "version").read_text()
    registry, stager = start(world, sum(s for _, s, _ in shards), sum(s for _, s, _ in shards))
    last = shards[-1][0]  # the second job stands at the last shard: the first job reads it last
    started: list[str] = []
    lock = threading.Lock()
    copy = stager_module.copy_shard

    def slow_copy(src: Any, dst: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            first = not started
            started.append(path)
        if first:  # the round is under way: the second job registers
            register_at(registry, west, version, position_of_shard(west, len(shards) - 1))
        time.sleep(0.2)  # a remote cluster: a copy takes a while
        return copy(src, dst, path, *args, **kwargs)

    monkeypatch.setattr(stager_module, "copy_shard", slow_copy)
    register(registry, west, version)
    stager.step()
    assert set(staged_files(staging)) == {p for p, _, _ in shards}
    assert started.index(last) <= stager_module.COPIES < len(shards) - 1  # next after the first copies


def test_a_plan_made_while_copies_are_in_flight_keeps_staging_within_its_budget(
    world: tuple[Path, Path, list[tuple[str, int, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second job registering within a round, the budget full of the copies in flight: once they land, staging
    holds no more than its budget (the plan made meanwhile counts them)."""
    from ferry.service.jobs import stager as stager_module

    west, staging, shards = world
    version = (west.parent / "version").read_text()
    sizes = [s for _, s, _ in shards]
    budget = sum(sizes[: stager_module.COPIES])
    registry, stager = start(world, budget, sum(sizes))
    copy = stager_module.copy_shard
    started: list[str] = []
    lock = threading.Lock()

    def slow_copy(src: Any, dst: Any, path: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            first = not started
            started.append(path)
        if first:
            register_at(registry, west, version, position_of_shard(west, len(shards) - 1))
        time.sleep(0.2)
        return copy(src, dst, path, *args, **kwargs)

    monkeypatch.setattr(stager_module, "copy_shard", slow_copy)
    register(registry, west, version)
    stager.step()
    assert sum(len(b) for b in staged_files(staging).values()) <= budget
    assert sum(stager.staged().values()) <= budget
