"""Compare-and-swap on every store that has one, each cloud store on its emulator over HTTP.

The contract (``ferry.shard_tools.storage.conditional``): ``write_if`` with a stale token, or a create over an
existing object, writes nothing and raises WriteConflictError, and concurrent read-modify-write
cycles lose no update. On GCS (fake-gcs-server) and Azure Blob (Azurite) that takes the store's
own preconditions: a check-then-write loses updates here.
"""

from __future__ import annotations

import threading

import pytest
from conftest import Backend, azurite_connection_string

from ferry.shard_tools.errors import StorageError, WriteConflictError
from ferry.shard_tools.storage.conditional import cas_kind, read_versioned, write_if
from ferry.shard_tools.storage.store import resolve, storage_error

WRITERS = 6
INCREMENTS = 8  # successful increments per writer
ATTEMPTS = 400  # per writer: a bound on the retries after conflicts


def test_cloud_stores_swap_with_preconditions() -> None:
    for url, options in (
        ("gs://bucket/ds", {"token": "anon", "endpoint_url": "http://127.0.0.1:9"}),
        ("az://container/ds", {"connection_string": azurite_connection_string("http://127.0.0.1:9/x")}),
        ("abfs://container/ds", {"connection_string": azurite_connection_string("http://127.0.0.1:9/x")}),
    ):
        assert cas_kind(resolve(url, options)) == "conditional", url


@pytest.mark.parametrize("name", ["gcs", "azure"])
def test_a_stale_token_or_a_second_create_writes_nothing(name: str, request: pytest.FixtureRequest) -> None:
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    loc = resolve(backend.url("cas"), backend.storage_options)
    t1 = write_if(loc, "obj", b"one", None)
    with pytest.raises(WriteConflictError):
        write_if(loc, "obj", b"other", None)
    t2 = write_if(loc, "obj", b"two", t1)
    assert t2 != t1
    for stale in (t1, "1" if name == "gcs" else '"0x8D000000000000"'):
        with pytest.raises(WriteConflictError):
            write_if(loc, "obj", b"lost", stale)
    got = read_versioned(loc, "obj")
    assert got.data == b"two" and got.token == t2


@pytest.mark.parametrize("name", ["gcs", "azure"])
def test_replacing_an_object_another_writer_removed_is_a_conflict(name: str, request: pytest.FixtureRequest) -> None:
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    loc = resolve(backend.url("cas"), backend.storage_options)
    token = write_if(loc, "obj", b"one", None)
    loc.remove("obj")
    with pytest.raises(WriteConflictError):
        write_if(loc, "obj", b"two", token)
    assert read_versioned(loc, "obj").data is None


def test_binary_data_round_trips(cas_backend: Backend) -> None:
    """Every byte value, CRLFs and multipart-looking lines survive the upload unchanged."""
    loc = resolve(cas_backend.url("bin"), cas_backend.storage_options)
    data = bytes(range(256)) * 3 + b"\r\n--ferry-0\r\n--==0==--\r\n" + bytes(range(255, -1, -1))
    token = write_if(loc, "obj", data, None)
    got = read_versioned(loc, "obj")
    assert got.data == data and got.token == token
    assert write_if(loc, "obj", b"", token) != token
    assert read_versioned(loc, "obj").data == b""


def test_concurrent_increments_lose_no_update(cas_backend: Backend) -> None:
    """WRITERS threads each add INCREMENTS to one counter by read → write_if, retrying on a conflict:
    the final counter is exactly the sum (check-then-write loses some)."""
    if cas_backend.name == "s3":
        pytest.skip(
            "moto checks If-Match and then writes, with no lock between: two concurrent conditional PUTs "
            "can both succeed there (seen here: 47 of 48 increments); AWS S3 decides them atomically"
        )
    loc = resolve(cas_backend.url("counter"), cas_backend.storage_options)
    write_if(loc, "n", b"0", None)
    start = threading.Barrier(WRITERS, timeout=30)
    errors: list[BaseException] = []
    conflicts = [0] * WRITERS

    def writer(i: int) -> None:
        try:
            start.wait()
            done = 0
            for _ in range(ATTEMPTS):
                if done == INCREMENTS:
                    return
                got = read_versioned(loc, "n")
                assert got.data is not None
                try:
                    write_if(loc, "n", str(int(got.data) + 1).encode(), got.token)
                    done += 1
                except WriteConflictError:
                    conflicts[i] += 1
            raise AssertionError(f"writer {i} made {done} of {INCREMENTS} increments in {ATTEMPTS} attempts")
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a writer did not finish in 120 s"
    assert errors == []
    assert read_versioned(loc, "n").data == str(WRITERS * INCREMENTS).encode()


def test_azure_refused_credentials_are_not_retried(azurite_endpoint: str) -> None:
    """A wrong account key: Azurite answers 403, which no retry fixes."""
    wrong = "d3Jvbmcga2V5" * 7 + "d3Jvbmc="
    loc = resolve(
        "az://nowhere/ds", {"connection_string": azurite_connection_string(azurite_endpoint, wrong),
                            "skip_instance_cache": True}
    )  # fmt: skip
    with pytest.raises(StorageError) as info:
        write_if(loc, "obj", b"x", None)
    assert info.value.retryable is False and not isinstance(info.value, WriteConflictError)
    with pytest.raises(StorageError) as info:
        read_versioned(loc, "obj")
    assert info.value.retryable is False


def test_gcs_refusal_is_not_retried() -> None:
    """gcsfs turns a 403 into a plain OSError("Forbidden: …") (no errno): it is still a refusal."""
    from gcsfs.retry import validate_response

    body = b'{"error": {"code": 403, "message": "anonymous caller does not have storage.objects.create access"}}'
    try:
        validate_response(403, body, "b/bucket/o/obj")
    except Exception as exc:  # noqa: BLE001
        assert storage_error("cannot write", exc).retryable is False
    else:
        pytest.fail("gcsfs accepted a 403")
    try:
        validate_response(503, b'{"error": {"code": 503, "message": "backend error"}}', "b/bucket/o/obj")
    except Exception as exc:  # noqa: BLE001
        assert storage_error("cannot write", exc).retryable is True


@pytest.mark.parametrize("name", ["gcs", "azure"])
def test_a_missing_bucket_is_a_storage_error_not_a_conflict(name: str, request: pytest.FixtureRequest) -> None:
    backend: Backend = request.getfixturevalue(f"{name}_backend")
    base = backend.base.rsplit("/", 1)[0]
    loc = resolve(f"{base}/ferry-no-such-bucket/ds", backend.storage_options)
    with pytest.raises(StorageError) as info:
        write_if(loc, "obj", b"x", None)
    assert not isinstance(info.value, WriteConflictError)
    assert "does the bucket exist" in str(info.value) or "container does not exist" in str(info.value)


@pytest.mark.parametrize("name", ["s3", "gcs", "azure"])
def test_a_retried_write_that_was_stored_is_not_a_conflict(name: str, request: pytest.FixtureRequest) -> None:
    """A client library re-sends a conditional write whose response was lost: the first attempt was
    stored, so the retry's precondition fails — on the very write it repeats. That is success (the
    writer re-basing on its own version would publish its documents twice); another write is not."""
    from ferry.shard_tools.storage.conditional import _PUT_IF

    backend: Backend = request.getfixturevalue(f"{name}_backend")
    loc = resolve(backend.url("retry"), backend.storage_options)
    put = _PUT_IF[name]
    first = put(loc, "obj", b"one", None, "write-a")
    assert put(loc, "obj", b"one", None, "write-a") == first  # the create, sent again
    second = put(loc, "obj", b"two", first, "write-b")
    assert put(loc, "obj", b"two", first, "write-b") == second  # the replace, sent again
    for token, write_id in ((None, "write-c"), (first, "write-c")):
        with pytest.raises(WriteConflictError):
            put(loc, "obj", b"three", token, write_id)
    got = read_versioned(loc, "obj")
    assert got.data == b"two" and got.token == second
