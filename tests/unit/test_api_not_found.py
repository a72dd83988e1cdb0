"""The API answers 404 for a NotFoundError (an unknown dataset, link, cluster or error id) and for
nothing else: a UsageError that names nothing unknown is a refused value (422)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from ferry.service.api.app import create_app
from ferry.service.api.backend import Invalid
from ferry.service.api.models import ActionResult, ReplicaMatrix, RetryIn, SyncIn
from ferry.shard_tools.errors import FerryError, InvalidValueError, NotFoundError, UsageError

TOKEN = "not-a-real-token-0123"


class _Backend:
    """The least of an ApiBackend the control routes need; ``fail`` is what sync and retry raise."""

    def __init__(self, fail: Exception) -> None:
        self.fail = fail

    def subscribe(self, callback: Any) -> Any:
        return lambda: None

    def replicas(self) -> ReplicaMatrix:
        return ReplicaMatrix(datasets=[], clusters=[], cells=[])

    def copied_bytes(self) -> dict[tuple[str, str, str], int]:
        return {}

    def sync(self, req: SyncIn) -> ActionResult:
        raise self.fail

    def retry(self, req: RetryIn) -> ActionResult:
        raise self.fail

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # the read routes: not called here
        def unused(*args: Any) -> Any:
            raise AssertionError(f"{name} called")

        return unused


@pytest.mark.parametrize(
    ("fail", "status"),
    [
        (NotFoundError("no rule replicates a dataset named 'x'"), 404),
        (UsageError("transfers must be at least 1"), 422),
        (Invalid("bwlimit must be a finite rate"), 422),
    ],
)
def test_only_not_found_errors_are_404(fail: Exception, status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_API_TOKEN", TOKEN)
    app = create_app(_Backend(fail), {"token_env": "FERRY_API_TOKEN"})
    with TestClient(app) as client:
        for path in ("/api/v1/sync", "/api/v1/retry"):
            r = client.post(path, json={}, headers={"Authorization": f"Bearer {TOKEN}"})
            assert r.status_code == status, (path, r.status_code, r.text)
            assert str(fail) in r.text


def test_a_refused_value_is_an_error_of_the_tree() -> None:
    """What the backend refuses is an InvalidValueError (a UsageError, so `ferry` exits 2 on it; still a
    ValueError), not an error of its own outside FerryError."""
    exc = Invalid("transfers must be at least 1")
    assert isinstance(exc, InvalidValueError) and isinstance(exc, UsageError) and isinstance(exc, FerryError)
    assert isinstance(exc, ValueError) and not isinstance(exc, NotFoundError)
    assert exc.exit_code == 2 and not exc.retryable
