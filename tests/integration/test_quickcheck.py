"""The no-op check without the storage stack: what it handles, its SigV4 signature, and `ferry sync` using it."""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import make_docs, pack

import ferry.service.replication.noop_check as noop_check
from ferry.service.cli import main
from ferry.shard_tools.storage.s3_get import S3Get, plan_s3_get, sign_v4

KEYS = {"key": "AKIDEXAMPLE", "secret": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"}


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """An environment with no AWS settings and no fsspec or credentials files (HOME is empty)."""
    return {"HOME": str(tmp_path / "home"), **extra}


@pytest.mark.parametrize(
    ("url", "options", "extra_env", "expected"),
    [
        # explicit endpoint: path-style, port kept in Host, key percent-encoded once
        ("s3://b1/ds/manifest.json", {**KEYS, "client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}, {},
         ("http", "127.0.0.1:9000", "/b1/ds/manifest.json", "us-east-1", True)),
        ("s3://b1/a b+c~d/manifest.json", {**KEYS, "endpoint_url": "https://minio.example:443/base/"}, {},
         ("https", "minio.example", "/base/b1/a%20b%2Bc~d/manifest.json", "us-east-1", True)),
        # AWS: virtual-hosted, region from the environment, keys from the environment
        ("s3://my-bucket/ds/manifest.json", {},
         {"AWS_ACCESS_KEY_ID": "A", "AWS_SECRET_ACCESS_KEY": "S", "AWS_REGION": "eu-west-3"},
         ("https", "my-bucket.s3.eu-west-3.amazonaws.com", "/ds/manifest.json", "eu-west-3", True)),
        # fsspec's environment defaults, anonymous reads
        ("s3://b1/x", {}, {"FSSPEC_S3_ENDPOINT_URL": "http://h:1", "FSSPEC_S3_ANON": "true"},
         ("http", "h:1", "/b1/x", "us-east-1", False)),
        # not handled: left to s3fs/botocore
        ("s3://b1/x", {**KEYS, "profile": "p"}, {}, None),  # a named profile
        ("s3://b1/x", {**KEYS, "client_kwargs": {"verify": False}}, {}, None),  # TLS settings
        ("s3://b1/x", {**KEYS, "config_kwargs": {"s3": {"addressing_style": "virtual"}}}, {}, None),
        ("s3://b1/x", {"key": "only-a-key"}, {}, None),  # half a key pair
        ("s3://b1/x", {}, {}, None),  # no credentials anywhere (instance roles, SSO: botocore's)
        ("s3://dotted.bucket/x", KEYS, {}, None),  # AWS with a dotted bucket name
        ("s3://b1/x", KEYS, {"AWS_USE_FIPS_ENDPOINT": "true"}, None),
        ("s3://b1", KEYS, {}, None),  # no key
        ("s3://my-bucket/x", KEYS, {"HTTPS_PROXY": "http://proxy:3128"}, None),  # a proxy: botocore goes through it
        ("s3://my-bucket/x", KEYS, {"http_proxy": "http://proxy:3128"}, None),
    ],
)  # fmt: skip
def test_plan_s3_get(
    tmp_path: Path, url: str, options: dict[str, Any], extra_env: dict[str, str], expected: Any
) -> None:
    get = plan_s3_get(url, options, _env(tmp_path, **extra_env))
    if expected is None:
        assert get is None
    else:
        assert get is not None
        assert (get.scheme, get.host, get.path, get.region, get.credentials is not None) == expected


def test_static_keys_come_from_the_shared_credentials_file_only_when_plain(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    creds.write_text("[default]\naws_access_key_id = AK\naws_secret_access_key = SK\n[role]\nrole_arn = arn:x\n")
    env = _env(tmp_path, AWS_SHARED_CREDENTIALS_FILE=str(creds), FSSPEC_S3_ENDPOINT_URL="http://h:1")
    get = plan_s3_get("s3://b1/x", {}, env)
    assert get is not None and get.credentials == ("AK", "SK", None)
    assert plan_s3_get("s3://b1/x", {}, {**env, "AWS_PROFILE": "role"}) is None  # assumed roles: botocore's


@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzEXAMPLE/+=="])
@pytest.mark.parametrize("path", ["/b1/ds/manifest.json", "/b1/a%20b%2Bc~d/%C3%A9/manifest.json"])
def test_signature_matches_botocores(token: str | None, path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import botocore.auth
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    when = datetime.datetime(2026, 11, 30, 12, 34, 56, tzinfo=datetime.timezone.utc)
    get = S3Get("http", "127.0.0.1:9000", path, "eu-central-1", (KEYS["key"], KEYS["secret"], token))
    ours = sign_v4(get, when)

    request = AWSRequest(method="GET", url=f"http://127.0.0.1:9000{path}", headers={})
    auth = S3SigV4Auth(Credentials(KEYS["key"], KEYS["secret"], token), "s3", "eu-central-1")
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: when.replace(tzinfo=None))
    auth.add_auth(request)
    assert ours["authorization"] == request.headers["Authorization"]
    assert ours["x-amz-date"] == request.headers["X-Amz-Date"]
    assert ours["x-amz-content-sha256"] == request.headers["X-Amz-Content-SHA256"]
    assert ours.get("x-amz-security-token") == request.headers.get("X-Amz-Security-Token")


def test_quoting_matches_botocores_key_encoding() -> None:
    from botocore.utils import percent_encode

    key = "ds/a b+c~d/é/ü?x=1#y/manifest.json"
    get = plan_s3_get(f"s3://b1/{key}", {**KEYS, "endpoint_url": "http://h:1"}, {"HOME": "/nonexistent"})
    assert get is not None and get.path == "/b1/" + percent_encode(key, safe="/~")


def _sync(capsys: pytest.CaptureFixture[str], src: str, dst: str, s3: Any) -> dict[str, Any]:
    """``ferry sync`` in this process; the moto endpoint as an option (fsspec read its environment at import)."""
    endpoint = s3.storage_options["client_kwargs"]["endpoint_url"]
    code = main(["sync", src, dst, "--json", "--no-progress", "--dst-option", f"client_kwargs.endpoint_url={endpoint}"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def test_sync_noop_to_s3_reads_two_manifests_and_reports_like_the_full_path(
    tmp_path: Path, s3_backend: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = str(tmp_path / "src"), s3_backend.url("quick")
    pack(src, make_docs(60, 3), {})
    first = _sync(capsys, src, dst, s3_backend)  # no manifest at the destination: the check declines, the engine copies
    assert first["copied"] > 0 and first["published"]

    reads: list[str] = []
    real_read = noop_check.read_manifest

    def counted(url: str, options: Any) -> bytes | None:
        reads.append(url)
        return real_read(url, options)

    monkeypatch.setattr(noop_check, "read_manifest", counted)
    fast = _sync(capsys, src, dst, s3_backend)
    assert reads == [src, dst]  # exactly the two manifest reads
    assert fast["up_to_date"] is True

    monkeypatch.setattr(noop_check, "up_to_date_header", lambda *a: None)  # the engine's own no-op
    full = _sync(capsys, src, dst, s3_backend)
    assert {k: v for k, v in fast.items() if k != "seconds"} == {k: v for k, v in full.items() if k != "seconds"}


def test_a_new_source_version_is_not_up_to_date(tmp_path: Path, s3_backend: Any, capsys: Any) -> None:
    src, dst = str(tmp_path / "src"), s3_backend.url("quick-new")
    pack(src, make_docs(40, 4), {})
    _sync(capsys, src, dst, s3_backend)
    pack(src, make_docs(80, 5), {}, append=True)  # a new version at the source
    again = _sync(capsys, src, dst, s3_backend)
    assert again["up_to_date"] is False and again["copied"] > 0 and again["published"]


def test_s3_noop_imports_no_storage_stack(tmp_path: Path, s3_backend: Any, capsys: Any) -> None:
    """The point of the check: a no-op to S3 loads neither s3fs nor botocore (a real subprocess)."""
    src, dst = str(tmp_path / "src"), s3_backend.url("quick-imports")
    pack(src, make_docs(30, 6), {})
    _sync(capsys, src, dst, s3_backend)
    probe = (
        "import sys; from ferry.shard_tools.cli import main; "
        "rc = main(['sync', sys.argv[1], sys.argv[2], '--json', '--no-progress']); "
        "print('LOADED', sorted(m for m in ('s3fs', 'botocore', 'fsspec', 'numpy') if m in sys.modules), rc, "
        "file=sys.stderr)"
    )
    run = subprocess.run([sys.executable, "-c", probe, src, dst], capture_output=True, text=True, timeout=60)
    assert run.stderr.strip().splitlines()[-1] == "LOADED [] 0", run.stderr
    assert json.loads(run.stdout)["up_to_date"] is True


def test_the_aws_config_file_gives_the_region_and_anything_else_leaves_it_to_botocore(tmp_path: Path) -> None:
    config = tmp_path / "config"
    env = _env(tmp_path, AWS_CONFIG_FILE=str(config), AWS_ACCESS_KEY_ID="A", AWS_SECRET_ACCESS_KEY="S")
    config.write_text(
        "[default]\nregion = ap-south-1\noutput = json\n[profile edge]\nendpoint_url = http://minio:9000\n"
    )
    get = plan_s3_get("s3://my-bucket/x", {}, env)
    assert get is not None and (get.host, get.region) == ("my-bucket.s3.ap-south-1.amazonaws.com", "ap-south-1")
    assert plan_s3_get("s3://my-bucket/x", {}, {**env, "AWS_PROFILE": "edge"}) is None  # its endpoint: botocore's
    config.write_text("[default]\nca_bundle = /etc/corp.pem\n")
    assert plan_s3_get("s3://my-bucket/x", {}, env) is None
    config.write_text("not an ini file")
    assert plan_s3_get("s3://my-bucket/x", {}, env) is None
    assert plan_s3_get("s3://my-bucket/x", {}, {**env, "AWS_CONFIG_FILE": str(tmp_path / "none")}) is not None
