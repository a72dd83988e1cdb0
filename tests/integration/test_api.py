"""The HTTP API against a real daemon replicating east → west over uvicorn on 127.0.0.1."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest
from configs import Link, Swarm
from helpers import TOKEN, Service, pack, running_service, wait_until

from ferry.shard_tools.dataset import load_manifest
from ferry.shard_tools.storage.store import resolve


@pytest.fixture
def svc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    with running_service(tmp_path, monkeypatch) as s:
        yield s


def _synced(svc: Service, name: str = "corpus") -> str:
    res = pack(svc.east(name))
    wait_until(lambda: svc.west_version(name) == res.version_id, what="west to publish the version")
    return res.version_id


def test_links_show_capacity_price_and_each_versions_egress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[[links]]`` capacity and price reach /links, and each version's egress is the bytes of the shards it
    added, priced at the link's price: the append sends only its new shards."""
    links = [Link("east", "west", capacity="10MiB/s", price_per_gb=0.09)]
    with running_service(tmp_path, monkeypatch, links=links) as svc:
        first = _synced(svc)
        added = pack(svc.east("corpus"), seed=1, append=True)
        wait_until(lambda: svc.west_version("corpus") == added.version_id, what="west to publish the append")
        shards = load_manifest(resolve(svc.east("corpus"))).shards
        old = {s.path for s in load_manifest(resolve(svc.east("corpus")), first).shards}
        new_bytes = sum(s.stored_bytes for s in shards if s.path not in old)
        http = httpx.Client(base_url=svc.url)
        [link] = wait_until(lambda: (ln := http.get("/api/v1/links").json()) and len(ln[0]["egress"]) == 2 and ln,
                            timeout=5, what="two egress rows")  # fmt: skip
        assert (link["capacity_bps"], link["price_per_gb"]) == (10 * 2**20, 0.09)
        assert [(e["version"], e["bytes"]) for e in link["egress"]] == [
            (added.version_id, new_bytes), (first, sum(s.stored_bytes for s in shards if s.path in old))
        ]  # fmt: skip
        for e in link["egress"]:
            assert e["cost"] == pytest.approx(e["bytes"] / 1e9 * 0.09)
        assert svc.client.links()[0].egress[0].bytes == new_bytes  # the typed client reads them too


def test_links_show_the_rate_a_routed_swarm_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``[swarm] routed`` the plan's rate per link reaches /links (the typed client's too); unrouted,
    and on a link the plan does not use, it is null."""
    links = [Link("east", "west", capacity="10MiB/s", price_per_gb=0.09)]
    with running_service(tmp_path, monkeypatch, links=links, swarm=Swarm(enabled=True, routed=True)) as svc:
        _synced(svc)
        http = httpx.Client(base_url=svc.url)
        [link] = http.get("/api/v1/links").json()
        assert link["planned_bps"] == 10 * 2**20
        assert svc.client.links()[0].planned_bps == 10 * 2**20
    with running_service(tmp_path / "unrouted", monkeypatch, links=links, swarm=Swarm(enabled=True)) as svc:
        _synced(svc)
        [link] = httpx.Client(base_url=svc.url).get("/api/v1/links").json()
        assert link["planned_bps"] is None


def test_read_endpoints_describe_a_finished_sync(svc: Service) -> None:
    version = _synced(svc)
    http = httpx.Client(base_url=svc.url)

    clusters = http.get("/api/v1/clusters").json()
    assert [(c["name"], c["is_source"], c["is_destination"]) for c in clusters] == [
        ("east", True, False),
        ("west", False, True),
    ]
    datasets = http.get("/api/v1/datasets").json()
    assert [(d["name"], d["source"], d["destinations"], d["version"]) for d in datasets] == [
        ("corpus", "east", ["west"], version)
    ]
    detail = http.get("/api/v1/datasets/corpus").json()
    assert detail["versions"] == [version] and detail["shards"] > 3
    west = next(r for r in detail["replicas"] if r["cluster"] == "west")
    assert west["state"] == "complete" and west["percent"] == 100.0
    assert west["verified_shards"] == west["total_shards"] == detail["shards"]

    matrix = http.get("/api/v1/replicas").json()
    assert matrix["datasets"] == ["corpus"] and matrix["clusters"] == ["east", "west"]
    states = {(c["dataset"], c["cluster"]): c["state"] for c in matrix["cells"]}
    assert states == {("corpus", "east"): "source", ("corpus", "west"): "complete"}

    assert http.get("/api/v1/transfers").json() == []
    history = http.get("/api/v1/history", params={"limit": 1000}).json()
    assert len(history) == detail["shards"] and all(h["ok"] and h["destination"] == "west" for h in history)
    assert len(http.get("/api/v1/history", params={"limit": 2, "dataset": "corpus"}).json()) == 2
    assert http.get("/api/v1/errors").json() == []

    links = http.get("/api/v1/links").json()
    assert [(ln["source"], ln["destination"], ln["lag_seconds"]) for ln in links] == [("east", "west", 0.0)]
    # what the version sent over the link: every shard's stored bytes, once (no [[links]]: no price, no capacity)
    egress = wait_until(lambda: http.get("/api/v1/links").json()[0]["egress"], timeout=5, what="the egress row")
    assert egress == [{"dataset": "corpus", "version": version, "bytes": detail["bytes"], "cost": 0.0}]
    assert (links[0]["price_per_gb"], links[0]["capacity_bps"]) == (0.0, None)
    # the version reached west well within the 1-minute SLA of the test config (the event may still be in flight)
    sla = wait_until(lambda: (ln := http.get("/api/v1/links").json()[0])["versions_total"] and ln, timeout=5)
    assert (sla["versions_total"], sla["versions_within_sla"], sla["share_within_sla"]) == (1, 1, 1.0)
    limits = http.get("/api/v1/limits").json()
    assert limits == {"transfers": 2, "global_bps": None, "links": {}}
    status = http.get("/api/v1/status").json()
    assert status["copied_bytes_total"] == detail["bytes"] and status["paused"] is False

    # the sampler records the copied bytes: some bucket of the last minute shows throughput
    tp = wait_until(
        lambda: (
            (t := http.get("/api/v1/throughput", params={"seconds": 60, "buckets": 6}).json())
            and sum(p["bps"] for p in t["points"]) > 0
            and t
        ),
        timeout=5,
        what="throughput samples",
    )
    assert len(tp["points"]) == 6 and tp["bucket_seconds"] == 10

    metrics = http.get("/metrics").text
    copied = 'ferry_copied_bytes_total{dataset="corpus",destination="west",source="east"} '
    assert float(metrics.split(copied, 1)[1].split()[0]) == detail["bytes"]
    assert 'ferry_pending_shards{cluster="west",dataset="corpus"} 0.0' in metrics
    assert "ferry_paused 0.0" in metrics

    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ok"}
    page = http.get("/")
    assert page.status_code == 200 and 'id="matrix"' in page.text
    assert http.get("/static/app.js").status_code == 200
    assert http.get("/static/../pyproject.toml").status_code == 404
    assert http.get("/static/index.py").status_code == 404


MUTATIONS = [
    ("POST", "/api/v1/sync", {}),
    ("POST", "/api/v1/pause", None),
    ("POST", "/api/v1/resume", None),
    ("PUT", "/api/v1/limits", {"transfers": 3}),
    ("POST", "/api/v1/scrub", {}),
    ("POST", "/api/v1/retry", {}),
]


@pytest.mark.parametrize(("method", "path", "body"), MUTATIONS)
def test_mutations_need_the_bearer_token(svc: Service, method: str, path: str, body: object) -> None:
    http = httpx.Client(base_url=svc.url)
    assert http.request(method, path, json=body).status_code == 401
    assert http.request(method, path, json=body, headers={"Authorization": "Basic eDp5"}).status_code == 401
    wrong = http.request(method, path, json=body, headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 403
    assert TOKEN not in wrong.text
    ok = http.request(method, path, json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert ok.status_code == 200, ok.text


def test_control_calls_change_the_daemon(svc: Service) -> None:
    _synced(svc)
    c = svc.client
    assert c.pause().ok and c.status().paused and svc.daemon.paused
    assert c.resume().ok and not c.status().paused
    limits = c.set_limits(global_bps=5 * 2**20, links={"east->west": 2**20}, transfers=3)
    assert (limits.global_bps, limits.links, limits.transfers) == (5 * 2**20, {"east->west": 2**20}, 3)
    assert svc.daemon.limits().global_bps == 5 * 2**20
    assert c.set_limits(global_bps=0).global_bps is None  # 0 = unlimited
    assert c.sync().affected == 1
    assert c.sync(dataset="corpus", source="east", destination="west").affected == 1
    assert c.scrub(dataset="corpus", cluster="west").affected == 1
    assert c.retry().affected == 0

    http = httpx.Client(base_url=svc.url, headers={"Authorization": f"Bearer {TOKEN}"})
    assert http.post("/api/v1/sync", json={"dataset": "nope"}).status_code == 404
    unknown = http.get("/api/v1/datasets/nope")  # the 404 says what is unknown, like every other 404
    assert unknown.status_code == 404 and "'nope'" in unknown.json()["detail"], unknown.text
    assert http.post("/api/v1/sync", json={"source": "east"}).json()["affected"] == 1  # every link from east
    assert http.post("/api/v1/sync", json={"destination": "east"}).status_code == 404  # no link ends at east
    assert http.post("/api/v1/sync", json={"source": "east", "destination": "mars"}).status_code == 404
    assert http.post("/api/v1/retry", json={"id": 12345}).status_code == 404
    assert http.post("/api/v1/scrub", json={"cluster": "mars"}).status_code == 404
    assert http.put("/api/v1/limits", json={"links": {"east->mars": 10}}).status_code == 404
    assert http.put("/api/v1/limits", json={"global_bps": -1}).status_code == 422
    assert http.put("/api/v1/limits", json={"surprise": 1}).status_code == 422


@pytest.mark.parametrize(
    ("path", "codes"),
    [
        ("/api/v1/datasets/unknown-ds", {404}),
        ("/api/v1/datasets/..", {404, 422}),
        ("/api/v1/datasets/%2e%2e%2fetc%2fpasswd", {404, 422}),
        ("/api/v1/datasets/a..b", {422}),
        ("/api/v1/datasets/.hidden", {422}),
        ("/api/v1/datasets/bad%00name", {422}),
        ("/api/v1/datasets/bad%0aname", {422}),
        ("/api/v1/datasets/" + "x" * 200, {422}),
        ("/api/v1/history?dataset=..%2F..", {422}),
        ("/api/v1/history?limit=0", {422}),
        ("/api/v1/throughput?seconds=1", {422}),
    ],
)
def test_bad_names_and_parameters_are_refused(svc: Service, path: str, codes: set[int]) -> None:
    r = httpx.get(svc.url + path)
    assert r.status_code in codes, (path, r.status_code, r.text)


def test_read_protection_by_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_service(tmp_path, monkeypatch, read_protected=True) as svc:
        http = httpx.Client(base_url=svc.url)
        for path in ("/api/v1/replicas", "/api/v1/status", "/api/v1/events", "/metrics"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 403, path
        assert http.get("/api/v1/replicas", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        assert http.get("/healthz").status_code == 200  # probes stay open
        assert svc.client.status().read_protected is True


def test_events_stream_progress_and_publication(svc: Service) -> None:
    got: list[str] = []
    seen = threading.Event()

    def follow() -> None:
        for ev in svc.client.events(timeout=20):
            got.append(ev.kind)
            if ev.kind == "version_published":
                seen.set()
                return

    t = threading.Thread(target=follow, daemon=True)
    t.start()
    wait_until(lambda: got, timeout=10, what="the hello event")
    _synced(svc)
    assert seen.wait(10), got
    assert got[0] == "hello" and "shard_verified" in got


def test_injected_failure_is_listed_and_retry_clears_it(svc: Service) -> None:
    res = pack(svc.east("corpus"))
    shards = sorted((Path(svc.east("corpus")) / "shards").iterdir())
    victim = shards[len(shards) // 2]
    good = victim.read_bytes()
    victim.write_bytes(good[:-64] + bytes(64))  # same size, wrong digest: the copy must refuse it
    errors = wait_until(svc.client.errors, timeout=30, what="an error for the corrupt shard")
    assert len(errors) == 1 and errors[0].shard.endswith(victim.name) and errors[0].cluster == "west"
    assert "digest" in errors[0].reason.lower() or "corrupt" in errors[0].reason.lower(), errors[0].reason
    cell = svc.client.replicas().cell("corpus", "west")
    assert cell is not None and cell.state == "failed" and cell.published_version is None

    victim.write_bytes(good)  # repair the source, then retry just that error
    assert svc.client.retry(errors[0].id).affected == 1
    wait_until(lambda: svc.west_version("corpus") == res.version_id, timeout=30, what="publication after retry")
    assert svc.client.errors() == []


def test_polled_reads_are_answered_ahead_of_the_middleware_stack(svc: Service) -> None:
    _synced(svc)
    fast_reads = svc.server.app.fast_reads
    http = httpx.Client(base_url=svc.url)
    for path in ("/api/v1/replicas", "/api/v1/status", "/api/v1/transfers", "/api/v1/links"):
        before = fast_reads.answered
        fast = http.get(path)
        assert fast_reads.answered == before + 1, path  # answered ahead of the app
        full = http.get(path + "?full=1")  # a query string takes the app's own route
        assert fast_reads.answered == before + 1, path
        assert fast.status_code == full.status_code == 200, path
        assert fast.headers["content-type"] == "application/json"
        if path != "/api/v1/status":  # status carries uptime, which moves between the two reads
            assert fast.json() == full.json(), path
    before = fast_reads.answered
    assert http.post("/api/v1/pause").status_code == 401  # mutations always go through the app
    assert http.get("/api/v1/errors").status_code == 200  # and so do paths it does not cache
    assert fast_reads.answered == before
