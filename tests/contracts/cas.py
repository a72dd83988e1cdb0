"""Compare-and-swap of small objects (``ferry.shard_tools.storage.conditional``), once for every store.

``read_versioned`` gives an object's bytes and a token naming exactly those bytes; ``write_if`` with a
stale token, or a create over an existing object, writes nothing and raises WriteConflictError, and
concurrent read-modify-write cycles lose no update. A subclass names the store's backend fixture
(``file``, ``memory``, ``s3``, ``gcs``, ``azure``: see tests/conftest.py), the kind ``cas_kind``
reports for it, and a token in the store's own form that no object there carries.
"""

from __future__ import annotations

import threading
import time
from typing import ClassVar

import pytest
from conftest import Backend

from ferry.shard_tools.errors import StorageError, WriteConflictError
from ferry.shard_tools.storage.conditional import cas_kind, read_versioned, write_if
from ferry.shard_tools.storage.store import Location, resolve

WRITERS = 6
INCREMENTS = 8  # successful increments per writer
ATTEMPTS = 400  # per writer: a bound on the retries after conflicts
JOIN_SECONDS = 120.0


class CasContract:
    """``write_if`` / ``read_versioned`` on one store."""

    backend_name: ClassVar[str]  # the conftest fixture ``<name>_backend``
    kind: ClassVar[str]  # what cas_kind says for the store
    forged_token: ClassVar[str]  # well-formed for the store, carried by no object

    @pytest.fixture
    def backend(self, request: pytest.FixtureRequest) -> Backend:
        return request.getfixturevalue(f"{self.backend_name}_backend")  # type: ignore[no-any-return]

    @pytest.fixture
    def loc(self, backend: Backend) -> Location:
        return resolve(backend.url("cas"), backend.storage_options)

    def test_the_store_says_how_it_swaps(self, loc: Location) -> None:
        assert cas_kind(loc) == self.kind

    def test_an_absent_object_has_no_token(self, loc: Location) -> None:
        got = read_versioned(loc, "obj")
        assert got.data is None and got.token is None

    def test_a_stale_token_or_a_second_create_writes_nothing(self, loc: Location) -> None:
        t1 = write_if(loc, "obj", b"one", None)
        with pytest.raises(WriteConflictError):
            write_if(loc, "obj", b"other", None)  # create-only over an existing object
        stale = read_versioned(loc, "obj")
        assert stale.data == b"one" and stale.token == t1
        t2 = write_if(loc, "obj", b"two", stale.token)
        assert t2 != t1
        for token in (t1, self.forged_token):  # another writer's token is gone; one never issued
            with pytest.raises(WriteConflictError):
                write_if(loc, "obj", b"lost", token)
        got = read_versioned(loc, "obj")
        assert got.data == b"two" and got.token == t2

    def test_replacing_an_object_another_writer_removed_is_a_conflict(self, loc: Location) -> None:
        token = write_if(loc, "obj", b"one", None)
        loc.remove("obj")
        with pytest.raises(WriteConflictError):
            write_if(loc, "obj", b"two", token)
        assert read_versioned(loc, "obj").data is None

    def test_binary_data_round_trips(self, loc: Location) -> None:
        """Every byte value, CRLFs and multipart-looking lines survive the upload unchanged."""
        data = bytes(range(256)) * 3 + b"\r\n--ferry-0\r\n--==0==--\r\n" + bytes(range(255, -1, -1))
        token = write_if(loc, "obj", data, None)
        got = read_versioned(loc, "obj")
        assert got.data == data and got.token == token
        assert write_if(loc, "obj", b"", token) != token
        assert read_versioned(loc, "obj").data == b""

    def test_concurrent_increments_lose_no_update(self, loc: Location, monkeypatch: pytest.MonkeyPatch) -> None:
        """WRITERS threads each add INCREMENTS to one counter by read → write_if, retrying on a conflict:
        the final counter is exactly the sum (check-then-write loses some)."""
        write_if(loc, "n", b"0", None)
        real_read = Location.read_bytes

        def slow_read(self: Location, rel: str) -> bytes:
            data = real_read(self, rel)
            time.sleep(0.002)  # another writer's turn between a check and its write, where nothing locks them
            return data

        monkeypatch.setattr(Location, "read_bytes", slow_read)
        start = threading.Barrier(WRITERS, timeout=30)
        errors: list[BaseException] = []

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
                        pass
                raise AssertionError(f"writer {i} made {done} of {INCREMENTS} increments in {ATTEMPTS} attempts")
            except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_SECONDS)
        assert not any(t.is_alive() for t in threads), f"a writer did not finish in {JOIN_SECONDS:.0f} s"
        assert errors == []
        assert read_versioned(loc, "n").data == str(WRITERS * INCREMENTS).encode()


class ConditionalStoreContract(CasContract):
    """A cloud store that swaps with the store's own preconditions (``kind`` ``conditional``)."""

    kind = "conditional"
    store: ClassVar[str]  # the key of conditional._PUT_IF / _GET

    def test_a_retried_write_that_was_stored_is_not_a_conflict(self, backend: Backend) -> None:
        """A client library re-sends a conditional write whose response was lost: the first attempt was
        stored, so the retry's precondition fails — on the very write it repeats. That is success (the
        writer re-basing on its own version would publish its documents twice); another write is not."""
        from ferry.shard_tools.storage.conditional import _PUT_IF

        loc = resolve(backend.url("retry"), backend.storage_options)
        put = _PUT_IF[self.store]
        first = put(loc, "obj", b"one", None, "write-a")
        assert put(loc, "obj", b"one", None, "write-a") == first  # the create, sent again
        second = put(loc, "obj", b"two", first, "write-b")
        assert put(loc, "obj", b"two", first, "write-b") == second  # the replace, sent again
        for token, write_id in ((None, "write-c"), (first, "write-c")):
            with pytest.raises(WriteConflictError):
                put(loc, "obj", b"three", token, write_id)
        got = read_versioned(loc, "obj")
        assert got.data == b"two" and got.token == second

    def test_a_missing_bucket_is_a_storage_error_not_a_conflict(self, backend: Backend) -> None:
        base = backend.base.rsplit("/", 1)[0]
        loc = resolve(f"{base}/ferry-no-such-bucket/ds", backend.storage_options)
        with pytest.raises(StorageError) as info:
            write_if(loc, "obj", b"x", None)
        assert not isinstance(info.value, WriteConflictError)
        assert "does the bucket exist" in str(info.value) or "container does not exist" in str(info.value)
