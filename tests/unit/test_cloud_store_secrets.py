"""ferry.toml refuses the Azure and GCS credentials written in place, as it does S3's."""

from __future__ import annotations

import pytest
from configs import Cluster, FerryToml, Rule

from ferry.service.config import parse_config
from ferry.shard_tools.errors import ConfigError

AZURITE = (
    "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=c2VjcmV0;"
    "BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;"
)


def _config(options: dict[str, object]) -> dict[str, object]:
    clusters = {"a": Cluster("az://container/ds", storage_options=options), "b": Cluster("/b")}
    return FerryToml(clusters=clusters, rules=[Rule("a", ["b"])]).doc()


@pytest.mark.parametrize(
    "options",
    [
        {"connection_string": AZURITE},  # carries the account key
        {"account_name": "devstoreaccount1", "account_key": "c2VjcmV0"},
        {"sas_token": "sv=2024&sig=abc"},
        {"client_secret": "abc"},
        {"token": {"type": "service_account", "private_key": "-----BEGIN PRIVATE KEY-----"}},
    ],
)
def test_a_cloud_credential_in_the_file_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="credentials must not be written"):
        parse_config(_config(options), env={})


def test_a_connection_string_from_the_environment_is_used() -> None:
    cfg = parse_config(_config({"connection_string": "$AZ_CONN"}), env={"AZ_CONN": AZURITE})
    assert cfg.clusters["a"].storage_options == {"connection_string": AZURITE}
