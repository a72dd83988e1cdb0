"""Compare-and-swap on every store that has one, each cloud store on its emulator over HTTP: the
contract of tests/contracts/cas.py, once per store, and each store's own refusals.

On GCS (fake-gcs-server) and Azure Blob (Azurite) the contract takes the store's own preconditions:
a check-then-write loses updates there.
"""

from __future__ import annotations

import pytest
from conftest import azurite_connection_string
from contracts.cas import CasContract, ConditionalStoreContract

from ferry.shard_tools.errors import StorageError, WriteConflictError
from ferry.shard_tools.storage.conditional import cas_kind, read_versioned, write_if
from ferry.shard_tools.storage.store import Location, resolve, storage_error


class TestCasOnFile(CasContract):
    backend_name = "file"
    kind = "lock"
    forged_token = "0" * 32  # an xxh128 of bytes no object holds


class TestCasOnMemory(CasContract):
    backend_name = "memory"
    kind = "memory"
    forged_token = "0" * 32


class TestCasOnS3(ConditionalStoreContract):
    backend_name = store = "s3"
    forged_token = '"00000000000000000000000000000000"'  # an ETag

    def test_concurrent_increments_lose_no_update(self, loc: Location, monkeypatch: pytest.MonkeyPatch) -> None:
        pytest.skip(
            "moto checks If-Match and then writes, with no lock between: two concurrent conditional PUTs "
            "can both succeed there; AWS S3 decides them atomically"
        )


class TestCasOnGcs(ConditionalStoreContract):
    backend_name = store = "gcs"
    forged_token = "1"  # a generation

    def test_refusal_is_not_retried(self) -> None:
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


class TestCasOnAzure(ConditionalStoreContract):
    backend_name = store = "azure"
    forged_token = '"0x8D000000000000"'  # an ETag

    def test_refused_credentials_are_not_retried(self, azurite_endpoint: str) -> None:
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


def test_cloud_urls_swap_with_preconditions_before_any_request() -> None:
    """The kind follows from the URL's filesystem alone: no server answers on port 9."""
    for url, options in (
        ("gs://bucket/ds", {"token": "anon", "endpoint_url": "http://127.0.0.1:9"}),
        ("az://container/ds", {"connection_string": azurite_connection_string("http://127.0.0.1:9/x")}),
        ("abfs://container/ds", {"connection_string": azurite_connection_string("http://127.0.0.1:9/x")}),
    ):
        assert cas_kind(resolve(url, options)) == "conditional", url
