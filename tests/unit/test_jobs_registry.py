"""The daemon's registry of jobs, its API routes against hostile bodies, the bounded per-job metrics, and the
loader's reporter against a daemon that forgets it or sees its plan change."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from ferry.client.service.job_types import Heartbeat, JobPhase, JobStats, Registration, SourcePlan
from ferry.client.service.jobs import JobReporter
from ferry.client.service.service_types import from_json
from ferry.service.api.app import create_app
from ferry.service.api.job_metrics import MAX_JOB_SERIES, OTHER, JobCollector
from ferry.service.api.models import ClusterOut, ReplicaMatrix
from ferry.service.jobs.registry import MISSES, JobRegistry, RegistryFull, plan_problem, resolve_replica
from ferry.shard_tools.errors import NotFoundError

TOKEN = "jobs-unit-token-0123"
SOURCE = SourcePlan(["/data/west/corpus"], "v1", "0", "global", 8, "tokens", 16)


def plan(name: str = "train", heartbeat_s: float = 1.0, **kw: Any) -> Registration:
    return Registration(name, 0, 1, 4, [SOURCE], [JobPhase(0, [1])], heartbeat_s=heartbeat_s, **kw)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_job_lives_while_it_heartbeats_and_expires_after_missed_beats() -> None:
    clock = Clock()
    reg = JobRegistry(lambda: [("west", "/data/west")], clock=clock)
    job = reg.register(plan(heartbeat_s=1.0))
    for _ in range(10):  # beats every second: alive long past its expiry horizon
        clock.now += 1.0
        reg.heartbeat(job.id, Heartbeat(position=int(clock.now), epoch=0, samples_per_second=1.0))
    (shown,) = reg.jobs()
    assert shown.position == int(clock.now) and shown.sources[0].dataset == "corpus"
    clock.now += MISSES * 1.0 + 1.9  # within the slack
    assert len(reg.jobs()) == 1
    clock.now += 0.2
    assert reg.jobs() == []
    with pytest.raises(NotFoundError, match="register again"):
        reg.heartbeat(job.id, Heartbeat(position=1, epoch=0, samples_per_second=0.0))


def test_a_heartbeat_carries_a_new_plan_and_the_registry_is_bounded() -> None:
    reg = JobRegistry(max_jobs=3)
    job = reg.register(plan())
    changed = dataclasses.replace(plan(), phases=[JobPhase(0, [1]), JobPhase(100, [1])])
    reg.heartbeat(job.id, Heartbeat(position=5, epoch=0, samples_per_second=0.0, registration=changed))
    assert reg.live()[0].plan == changed and reg.live()[0].beat.registration is None
    reg.register(plan())
    reg.register(plan())
    with pytest.raises(RegistryFull):
        reg.register(plan())
    reg.remove(job.id)
    reg.register(plan())  # room again


def test_a_registration_or_a_new_plan_tells_the_stager_and_a_plain_heartbeat_does_not() -> None:
    reg = JobRegistry()
    told: list[int] = []
    reg.on_plan = lambda: told.append(len(reg.live()))
    job = reg.register(plan())
    assert told == [1]  # after the job is listed: the plan made then sees it
    reg.heartbeat(job.id, Heartbeat(position=5, epoch=0, samples_per_second=0.0))
    assert told == [1]
    changed = dataclasses.replace(plan(), phases=[JobPhase(0, [1]), JobPhase(100, [1])])
    reg.heartbeat(job.id, Heartbeat(position=6, epoch=0, samples_per_second=0.0, registration=changed))
    assert told == [1, 1]


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/data/west/corpus", ("west", "corpus")),
        ("file:///data/west/corpus/", ("west", "corpus")),
        ("s3://user:secret@bucket/root/ds?token=x", ("s3", "ds")),
        ("/data/west2/corpus", (None, None)),  # a sibling whose name starts like the cluster's
        ("/data/west/a/b", (None, None)),  # deeper than a dataset
        ("/data/west", (None, None)),
        ("", (None, None)),
    ],
)
def test_a_replica_url_resolves_to_its_cluster_and_dataset(url: str, expected: tuple[str | None, str | None]) -> None:
    clusters = [("west", "/data/west/"), ("s3", "s3://bucket/root")]
    assert resolve_replica(url, clusters) == expected


def test_job_metrics_keep_a_bounded_number_of_series() -> None:
    reg = JobRegistry()
    for i in range(MAX_JOB_SERIES + 30):
        for rank in range(2):
            job = reg.register(dataclasses.replace(plan(f"job{i:03d}"), rank=rank, world_size=2))
            stats = JobStats(stall_s=float(i), wall_s=100.0)
            reg.heartbeat(job.id, Heartbeat(position=10 * i + rank, epoch=0, samples_per_second=1.0, stats=stats))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(reg.jobs, lambda _id: None))
    text = generate_latest(registry).decode()
    ranks = [line for line in text.splitlines() if line.startswith("ferry_job_ranks{")]
    assert len(ranks) == MAX_JOB_SERIES + 1
    assert f'ferry_job_ranks{{training_job="{OTHER}"}} 60.0' in text  # 30 jobs of 2 ranks
    assert 'ferry_job_ranks{training_job="job079"} 2.0' in text  # the most stalled keep their own series
    assert 'training_job="job000"' not in text
    assert 'ferry_job_position{training_job="job079"} 790.0' in text  # the slowest rank
    assert "ferry_jobs 160.0" in text


class _Backend:
    def subscribe(self, callback: Any) -> Any:
        return lambda: None

    def replicas(self) -> ReplicaMatrix:
        return ReplicaMatrix(datasets=[], clusters=[], cells=[])

    def copied_bytes(self) -> dict[tuple[str, str, str], int]:
        return {}

    def clusters(self) -> list[ClusterOut]:
        return [ClusterOut(name="west", url="/data/west", protocol="file", priority=1, is_source=False,
                           is_destination=True)]  # fmt: skip

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # the other read routes: not called here
        def unused(*args: Any) -> Any:
            raise AssertionError(f"{name} called")

        return unused


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("FERRY_API_TOKEN", TOKEN)
    with TestClient(
        create_app(_Backend(), {"token_env": "FERRY_API_TOKEN"}), headers={"Authorization": f"Bearer {TOKEN}"}
    ) as c:
        yield c


def _body(**changes: Any) -> dict[str, Any]:
    return {**dataclasses.asdict(plan()), **changes}


@pytest.mark.parametrize(
    ("changes", "status"),
    [
        ({"name": "../../etc"}, 422),
        ({"name": "a\nb"}, 422),
        ({"rank": -1}, 422),
        ({"world_size": 0}, 422),
        ({"sources": []}, 422),
        ({"phases": [{"start": 0, "quota": [-1]}]}, 422),
        ({"heartbeat_s": 0}, 422),
        ({"unknown": 1}, 422),
        ({"sources": [{**dataclasses.asdict(SOURCE), "shuffle": "chaos"}]}, 422),
        ({"sources": [{**dataclasses.asdict(SOURCE), "urls": ["x" * 3000]}]}, 422),
        ({"phases": [{"start": i, "quota": [1]} for i in range(20_000)]}, 413),
    ],
)
def test_hostile_registrations_are_refused(client: TestClient, changes: dict[str, Any], status: int) -> None:
    r = client.post("/api/v1/jobs", content=json.dumps(_body(**changes)), headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert client.get("/api/v1/jobs").json() == []


@pytest.mark.parametrize("stats", ['{"fetch_p50_s": NaN}', '{"stall_s": Infinity}', '{"wall_s": -Infinity}',
                                   '{"fetch_p99_s": 1e400}', '{"stall_share": 1.5}'])  # fmt: skip
def test_hostile_heartbeats_are_refused(client: TestClient, stats: str) -> None:
    job_id = client.post("/api/v1/jobs", json=_body()).json()["id"]
    body = f'{{"position": 1, "epoch": 0, "samples_per_second": 1, "stats": {stats}}}'
    r = client.put(f"/api/v1/jobs/{job_id}", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert client.get("/api/v1/jobs").status_code == 200


@pytest.mark.parametrize(
    "changes",
    [
        {"phases": [{"start": 0, "quota": [1]}, {"start": 0, "quota": [1]}]},  # starts not increasing
        {"phases": [{"start": 5, "quota": [1]}]},  # not from 0
        {"phases": [{"start": 0, "quota": [1, 1]}]},  # two sources named, one in the plan
        {"phases": [{"start": 0, "quota": [0]}]},  # nothing drawn
        {"rank": 4, "world_size": 4},
        {"sources": [{**dataclasses.asdict(SOURCE), "urls": ["http://[", "/data/west/corpus"]}]},
        {"sources": [{**dataclasses.asdict(SOURCE), "urls": ["s3://b:99999/x"]}]},
    ],
)
def test_a_plan_no_loader_could_have_is_listed_and_named(client: TestClient, changes: dict[str, Any]) -> None:
    """Listed (the schema admits it), shown safely, and named by ``plan_problem`` (staging leaves it out)."""
    body = _body(**changes)
    assert client.post("/api/v1/jobs", json=body).status_code == 201
    r = client.get("/api/v1/jobs")
    assert r.status_code == 200 and len(r.json()) == 1, r.text
    assert "[" not in r.json()[0]["sources"][0]["replica"] or "not parse" in r.json()[0]["sources"][0]["replica"]
    assert plan_problem(from_json(Registration, body)) is not None
    assert plan_problem(plan()) is None


def test_register_heartbeat_list_and_leave(client: TestClient) -> None:
    r = client.post("/api/v1/jobs", json=_body())
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert client.put("/api/v1/jobs/0123456789abcdef", json={"position": 1, "epoch": 0, "samples_per_second": 0}
                      ).status_code == 404  # fmt: skip
    assert client.put(f"/api/v1/jobs/{job_id}/../x", json={}).status_code == 422  # not an id: refused
    beat = {"position": 40, "epoch": 1, "samples_per_second": 12.5, "stats": {"stall_share": 0.25, "batches": 10}}
    assert client.put(f"/api/v1/jobs/{job_id}", json=beat).status_code == 200
    (job,) = client.get("/api/v1/jobs").json()
    assert (job["position"], job["epoch"], job["stats"]["stall_share"]) == (40, 1, 0.25)
    assert job["sources"][0] == {"replica": "/data/west/corpus", "dataset": "corpus", "cluster": "west",
                                 "version": "v1", "shuffle": "global", "seed": "0"}  # fmt: skip
    assert client.get(f"/api/v1/jobs/{job_id}").json()["id"] == job_id
    assert client.delete(f"/api/v1/jobs/{job_id}", headers={"Authorization": "Bearer nope"}).status_code == 403
    assert client.delete(f"/api/v1/jobs/{job_id}").status_code == 204
    assert client.get("/api/v1/jobs").json() == []


class _FakeLoader:
    """What the reporter reads of a TokenLoader."""

    def __init__(self) -> None:
        self.position, self.epoch, self.rank, self.world_size, self.batch_size = 0, 0, 0, 1, 4
        self.dataset = _FakeDataset()

    def stats(self) -> dict[str, Any]:
        return {"stall_share": 0.5, "replicas": {"/data/west/corpus": {"bytes": 7, "latency_p50_s": 0.01,
                                                                        "latency_p99_s": float("inf")}}}  # fmt: skip


class _FakeDataset:
    window = 8

    class replicas:  # noqa: N801 — an attribute of the dataset, as TokenDataset.replicas
        names = ["/data/west/corpus"]

    def __init__(self) -> None:
        self.seed = 0

    def identity(self) -> dict[str, Any]:
        return {"dataset_version": "v1", "seed": self.seed, "shuffle": "global", "mode": "tokens", "seq_len": 16}

    def record(self) -> dict[str, Any]:
        return {}


def test_the_reporter_registers_again_after_a_404_and_sends_a_changed_plan() -> None:
    seen: list[tuple[str, str, dict[str, Any]]] = []
    forget = {"now": False}

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        seen.append((request.method, request.url.path, body))
        if request.method == "POST":
            return httpx.Response(201, json={"id": f"{len(seen):016x}", "expires_in_s": 5})
        if request.method == "PUT" and forget["now"]:
            forget["now"] = False
            return httpx.Response(404, json={"detail": "gone"})
        return httpx.Response(200, json={"id": "x", "expires_in_s": 5})

    loader = _FakeLoader()
    reporter = JobReporter("http://daemon", None, loader, interval=0.02, transport=httpx.MockTransport(handle))
    reporter.start()

    def methods() -> list[str]:
        return [m for m, _, _ in seen]

    _wait(lambda: methods().count("PUT") >= 2)
    put = next(b for m, _, b in seen if m == "PUT")
    assert put["stats"]["replica_bytes"] == {"/data/west/corpus": 7} and put["stats"]["fetch_p99_s"] is None
    forget["now"] = True
    _wait(lambda: methods().count("POST") >= 2)  # the daemon forgot the job: it registers anew
    loader.dataset.seed = 9  # a re-planned run: the next heartbeat carries the new plan
    _wait(lambda: any(m == "PUT" and b.get("registration") for m, _, b in seen))
    sent = next(b for m, _, b in seen if m == "PUT" and b.get("registration"))
    assert sent["registration"]["sources"][0]["seed"] == "9"
    del loader
    gc.collect()
    _wait(lambda: reporter._thread is not None and not reporter._thread.is_alive())  # the loader went: so did it
    assert seen[-1][0] == "DELETE"


def _wait(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_ferry_status_lists_the_jobs() -> None:
    from ferry.client.service.cli import render_status
    from ferry.client.service.job_types import Job, JobSource
    from ferry.client.service.service_types import Limits, ReplicaMatrix, Status

    status = Status(False, True, "0.1", 5, 0, 0, 0, 0.0, 0, 0, None, Limits(4, None, {}), 60, False)
    job = Job("0123456789abcdef", "llama\x1b[2J", 3, 8, 4, "host", 1, [JobSource("/c/west/ds", "ds", "west", "v1abc",
              "window", "0")], 1, 0.0, 0.0, 1234, 0, 56.0, JobStats(stall_share=0.072))  # fmt: skip
    text = render_status("http://x", status, ReplicaMatrix([], [], []), [], [], [job])
    assert "JOBS (1)" in text and "\x1b" not in text
    row = next(line for line in text.splitlines() if line.startswith("llama"))
    assert row.split() == ["llama\\x1b[2J", "3/8", "ds@v1abc", "west", "1234", "56/s", "7.2%"]


def test_the_service_argument_is_checked() -> None:
    from ferry.client.service.jobs import report_jobs
    from ferry.shard_tools.errors import UsageError

    with pytest.raises(UsageError, match="service must be a URL"):
        report_jobs(object(), 8765)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="service must be a URL"):
        report_jobs(object(), True)
    assert report_jobs(object(), False) is None


def test_a_copied_loader_does_not_report() -> None:
    import copy
    import pickle

    loader = _FakeLoader()
    reporter = JobReporter("http://127.0.0.1:9", None, loader, interval=60)
    holder = {"job": reporter}
    assert copy.deepcopy(holder) == {"job": None} and pickle.loads(pickle.dumps(holder)) == {"job": None}
