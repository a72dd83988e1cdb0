"""ServiceClient against a live server on 127.0.0.1, plus its error mapping through an injected transport."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from helpers import TOKEN, pack, running_service, wait_until

from ferry.client import ServiceClient
from ferry.client.service.service_types import ReplicaMatrix, Status
from ferry.shard_tools.errors import ServiceError


def test_every_method_against_a_live_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with running_service(tmp_path, monkeypatch) as svc:
        res = pack(svc.east("corpus"))
        c = svc.client
        wait_until(lambda: svc.west_version("corpus") == res.version_id, what="replication")
        assert c.healthy() and c.ready()
        st = c.status()
        assert isinstance(st, Status) and st.limits.transfers == 2 and st.copied_bytes_total == res.stored_bytes
        assert [cl.name for cl in c.clusters()] == ["east", "west"]
        assert [(d.name, d.version, d.shards) for d in c.datasets()] == [("corpus", res.version_id, res.shards)]
        detail = c.dataset("corpus")
        assert detail.versions == [res.version_id] and {r.cluster for r in detail.replicas} == {"east", "west"}
        matrix = c.replicas()
        assert isinstance(matrix, ReplicaMatrix)
        west = matrix.cell("corpus", "west")
        assert west is not None and west.state == "complete" and west.verified_shards == res.shards
        assert matrix.cell("corpus", "mars") is None
        assert c.transfers() == []
        assert len(c.history(limit=5)) == min(5, res.shards)
        assert all(h.dataset == "corpus" for h in c.history(dataset="corpus"))
        assert c.errors() == []
        assert [(ln.source, ln.destination) for ln in c.links()] == [("east", "west")]
        assert len(c.throughput(seconds=60, buckets=4).points) == 4
        assert c.limits().global_bps is None
        assert "ferry_copied_bytes_total" in c.metrics()
        assert c.pause().message == "paused" and c.status().paused
        assert c.resume().ok and not c.status().paused
        assert c.set_limits(transfers=3).transfers == 3
        assert c.sync(dataset="corpus").affected == 1
        assert c.scrub().affected >= 1
        assert c.retry().affected == 0
        events = list(c.events(max_events=1, timeout=10))
        assert events[0].kind == "hello" and events[0].data["status"]["limits"]["transfers"] == 3

        with pytest.raises(ServiceError) as e404:
            c.dataset("nope")
        assert e404.value.status == 404
        with pytest.raises(ServiceError) as e403:
            ServiceClient(svc.url, token="wrong").pause()
        assert e403.value.status == 403
        with pytest.raises(ServiceError) as e401:
            ServiceClient(svc.url).resume()
        assert e401.value.status == 401
        assert TOKEN not in repr(c)


def test_unreachable_server_is_a_service_error_with_status_0() -> None:
    from conftest import free_port

    c = ServiceClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    with pytest.raises(ServiceError) as exc:
        c.status()
    assert exc.value.status == 0 and "cannot reach" in str(exc.value)
    assert c.healthy() is False


def test_injected_transport_sees_the_token_and_maps_errors() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/api/v1/pause":
            return httpx.Response(200, json={"ok": True, "message": "paused", "affected": 0})
        if request.url.path == "/api/v1/events":
            body = b': keep-alive\n\nevent: hello\nid: 0\ndata: {"a": 1}\n\nevent: error\ndata: {"id": 3}\n\n'
            return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})
        return httpx.Response(422, json={"detail": [{"loc": ["body", "id"], "msg": "bad"}]})

    c = ServiceClient("http://ferry.invalid", token="sekrit", transport=httpx.MockTransport(handler))
    assert c.pause().ok
    assert seen[-1].headers["authorization"] == "Bearer sekrit" and seen[-1].method == "POST"
    events = list(c.events())
    assert [(e.kind, e.data, e.id) for e in events] == [("hello", {"a": 1}, 0), ("error", {"id": 3}, None)]
    with pytest.raises(ServiceError) as exc:
        c.retry(5)
    assert exc.value.status == 422 and "bad" in str(exc.value)
    assert json.loads(seen[-1].content) == {"id": 5}


def test_client_types_mirror_the_api_models() -> None:
    """ferry.service.api.models builds its response models from ferry.client.service.service_types (the client must
    not import the service): each pair has the same fields, in the same order."""
    import dataclasses

    from ferry.client.service import service_types as ct
    from ferry.service.api import models as sm

    pairs = {
        ct.Cluster: sm.ClusterOut,
        ct.DatasetSummary: sm.DatasetSummary,
        ct.DatasetDetail: sm.DatasetDetail,
        ct.ReplicaCell: sm.ReplicaCell,
        ct.ReplicaMatrix: sm.ReplicaMatrix,
        ct.Transfer: sm.TransferOut,
        ct.HistoryEntry: sm.HistoryEntry,
        ct.ErrorEntry: sm.ErrorEntry,
        ct.Link: sm.LinkOut,
        ct.Throughput: sm.ThroughputOut,
        ct.ThroughputPoint: sm.ThroughputPoint,
        ct.Limits: sm.LimitsOut,
        ct.Status: sm.StatusOut,
        ct.ActionResult: sm.ActionResult,
    }
    for client_type, model in pairs.items():
        assert [f.name for f in dataclasses.fields(client_type)] == list(model.model_fields), client_type.__name__


def test_public_names() -> None:
    import ferry.service.api
    from ferry import client

    assert "ServiceClient" in client.__all__
    assert sorted(ferry.service.api.__all__) == [
        "ApiBackend", "ApiSettings", "RunningServer", "create_app", "run_server", "start_server",
    ]  # fmt: skip
