"""Joining a Ray cluster (shard_tools/ray_session.py), with a stand-in for ``ray``: a failed start is
undone and raised as a UsageError; a Ray Client session whose server died is asked for again, a bounded
number of times, and nothing else is."""

from __future__ import annotations

import pytest

from ferry.shard_tools import ray_session
from ferry.shard_tools.errors import UsageError


class _FlakyRay:
    """``ray.init`` that raises ``failures`` in turn, then connects; ``calls`` records init and shutdown."""

    def __init__(self, failures: list[Exception]) -> None:
        self.failures = failures
        self.calls: list[str] = []

    def init(self, address: str | None, **_: object) -> None:
        self.calls.append(f"init {address}")
        if self.failures:
            raise self.failures.pop(0)

    def shutdown(self) -> None:
        self.calls.append("shutdown")


_DIED = ConnectionAbortedError(
    "Initialization failure from server:\nRuntimeError: Starting Ray client server failed. "
    "See ray_client_server_23004.err for detailed logs."
)
#: the proxy's answer when the server died before the proxy read its command line
_ZOMBIE = ConnectionAbortedError(
    'Initialization failure from server:\nTraceback (most recent call last):\n  File "proxier.py", line 396, in '
    "start_specific_server\n    cmd = psutil_proc.cmdline()\npsutil.ZombieProcess: PID still exists but it's a "
    "zombie (pid=1512)"
)
#: the proxy's answer when the server started but died before answering it
_LOST = ConnectionAbortedError(
    "Initialization failure from server:\nRuntimeError: Proxy failed to Connect to backend! Check "
    "`ray_client_server.err` and `ray_client_server_23000.err` on the head node of the cluster"
)


def test_a_ray_client_session_whose_server_died_at_start_is_asked_for_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Ray Client's proxy sometimes loses the server it forks for a new session (a gRPC fork race in Ray):
    another session is asked for, after the failed one is undone, and the log says so."""
    monkeypatch.setattr(ray_session, "_SESSION_PAUSE", 0.0)
    ray = _FlakyRay([_DIED, _ZOMBIE, _LOST])
    ray_session.init_ray(ray, "ray://head:10001", "cannot reach")
    assert ray.calls == ["init ray://head:10001", "shutdown"] * 3 + ["init ray://head:10001"]
    assert [r.getMessage() for r in caplog.records].count(
        "the Ray Client server for this session died as it started (ray-project/ray#63202); "
        "asking ray://head:10001 for another session (2 of 4)"
    ) == 1


def test_ray_sessions_are_asked_for_a_bounded_number_of_times_and_only_for_a_dead_server(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ray_session, "_SESSION_PAUSE", 0.0)
    always = _FlakyRay([_DIED] * 10)
    with pytest.raises(UsageError, match=r"^cannot reach \(4 sessions asked for\): Initialization failure"):
        ray_session.init_ray(always, "ray://head:10001", "cannot reach")
    assert always.calls.count("init ray://head:10001") == 4 and always.calls[-1] == "shutdown"
    # any other failure, or the same words from a driver on a node (no Ray Client), is final at once
    for address, exc in [("ray://head:10001", ConnectionError("refused")), ("10.0.0.1:6379", _DIED), (None, _DIED)]:
        once = _FlakyRay([exc, exc])
        with pytest.raises(UsageError, match="^cannot reach: ") as got:
            ray_session.init_ray(once, address, "cannot reach")
        assert once.calls == [f"init {address}", "shutdown"]
        assert "sessions asked for" not in str(got.value)
