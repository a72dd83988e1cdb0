"""One S3 GET without botocore: where to send it for a set of storage options, and its SigV4 signature.

It handles the plain settings only (keys from storage options, the environment or static keys in
the shared credentials file; an explicit or the AWS endpoint); for anything else ``plan_s3_get``
says None and the caller goes through fsspec.

Kept beside botocore: measured cheaper to import and to sign with than botocore's signer (docs/BENCHMARKS.md, Scale).
"""

from __future__ import annotations

import configparser
import datetime
import hashlib
import hmac
import http.client
import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["S3Get", "connect", "plan_s3_get", "sign_v4", "fetch"]

_TIMEOUT = 10.0
_EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
# storage options a plain GET honours (the rest, e.g. profile or requester_pays, mean: full path)
_OPTIONS = {"key", "secret", "token", "anon", "endpoint_url", "client_kwargs", "config_kwargs", "skip_instance_cache"}
_PROXY_VARS = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy")
_DNS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class S3Get:
    """One object read: where to send it and how to sign it (``credentials`` None: anonymous)."""

    scheme: str
    host: str  # with ":port" when not the scheme's default
    path: str  # already URI-encoded
    region: str
    credentials: tuple[str, str, str | None] | None  # (access key id, secret, session token)


def plan_s3_get(url: str, options: Mapping[str, Any], env: Mapping[str, str]) -> S3Get | None:
    """How to GET ``s3://bucket/key`` with these storage options and environment, or None (not handled)."""
    opts = _fsspec_env_options(env)
    if opts is None:
        return None
    opts.update(options)
    if set(opts) - _OPTIONS:
        return None
    client = dict(opts.get("client_kwargs") or {})
    if set(client) - {"endpoint_url", "region_name"}:
        return None
    config = dict(opts.get("config_kwargs") or {})
    if set(config) - {"s3"} or set(config.get("s3") or {}) - {"payload_signing_enabled"}:
        return None
    if any(env.get(v) for v in ("AWS_USE_FIPS_ENDPOINT", "AWS_USE_DUALSTACK_ENDPOINT", "AWS_S3_US_EAST_1_REGIONAL")):
        return None
    if any(env.get(v) for v in _PROXY_VARS):
        return None  # botocore sends through the proxy; a direct connection may hang where only the proxy is open
    profile_config = _config_profile(env)
    if profile_config is None:
        return None
    bucket, _, key = url.split("://", 1)[1].partition("/")
    if not bucket or not key:
        return None
    region = (
        client.get("region_name")
        or env.get("AWS_REGION")
        or env.get("AWS_DEFAULT_REGION")
        or profile_config.get("region")
        or "us-east-1"
    )
    endpoint = (
        opts.get("endpoint_url")
        or client.get("endpoint_url")
        or env.get("AWS_ENDPOINT_URL_S3")
        or env.get("AWS_ENDPOINT_URL")
    )
    anon = opts.get("anon") in (True, "true", "True", "1", 1)
    credentials = None if anon else _credentials(opts, env)
    if credentials is None and not anon:
        return None
    quoted_key = urllib.parse.quote(key, safe="/~")
    if endpoint:
        u = urllib.parse.urlsplit(str(endpoint))
        if u.scheme not in ("http", "https") or not u.hostname or u.query:
            return None
        base = u.path.rstrip("/")
        path = f"{urllib.parse.quote(base, safe='/~')}/{urllib.parse.quote(bucket, safe='')}/{quoted_key}"
        host = u.hostname if u.port in (None, 80 if u.scheme == "http" else 443) else f"{u.hostname}:{u.port}"
        return S3Get(u.scheme, host, path, str(region), credentials)
    if not _DNS_BUCKET.match(bucket) or not re.fullmatch(r"[a-z0-9-]+", str(region)):
        return None  # dotted or odd bucket names and unusual regions: botocore knows the rules
    return S3Get("https", f"{bucket}.s3.{region}.amazonaws.com", f"/{quoted_key}", str(region), credentials)


def _home(env: Mapping[str, str]) -> Path:
    return Path(env["HOME"]) if env.get("HOME") else Path.home()


def _config_profile(env: Mapping[str, str]) -> dict[str, str] | None:
    """The profile's settings in the AWS config file (``{}`` without one), or None when it sets anything but the
    region and output format (an endpoint, a CA bundle, a role, retries: botocore's business)."""
    path = Path(env.get("AWS_CONFIG_FILE") or _home(env) / ".aws" / "config")
    parser = configparser.RawConfigParser()
    try:
        if not parser.read(path):
            return {}
    except (configparser.Error, UnicodeDecodeError):
        return None
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    name = profile if profile == "default" else f"profile {profile}"
    if not parser.has_section(name):
        return {}
    section = dict(parser.items(name))
    return section if set(section) <= {"region", "output"} else None


def _fsspec_env_options(env: Mapping[str, str]) -> dict[str, Any] | None:
    """fsspec's own defaults for s3 from ``FSSPEC_S3`` / ``FSSPEC_S3_<KWARG>``; None if config files exist."""
    conf_dir = Path(env.get("FSSPEC_CONFIG_DIR") or _home(env) / ".config" / "fsspec")
    if conf_dir.is_dir() and any(conf_dir.iterdir()):
        return None  # config files may hold anything: leave them to fsspec
    out: dict[str, Any] = {}
    if env.get("FSSPEC_S3"):
        try:
            blob = json.loads(env["FSSPEC_S3"])
        except json.JSONDecodeError:
            return None
        if not isinstance(blob, dict):
            return None
        out.update(blob)
    for name, value in env.items():
        if name.startswith("FSSPEC_S3_"):
            try:
                out[name[len("FSSPEC_S3_") :].lower()] = json.loads(value)
            except json.JSONDecodeError:
                out[name[len("FSSPEC_S3_") :].lower()] = value
    return out


def _credentials(opts: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """Static keys in botocore's order: explicit, environment, the shared credentials file; else None."""
    if opts.get("key") and opts.get("secret"):
        return str(opts["key"]), str(opts["secret"]), opts.get("token") and str(opts["token"])
    if opts.get("key") or opts.get("secret") or opts.get("token"):
        return None
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        return env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env.get("AWS_SESSION_TOKEN") or None
    if any(env.get(v) for v in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_WEB_IDENTITY_TOKEN_FILE")):
        return None
    path = Path(env.get("AWS_SHARED_CREDENTIALS_FILE") or _home(env) / ".aws" / "credentials")
    parser = configparser.RawConfigParser()
    try:
        if not parser.read(path):
            return None
    except configparser.Error:
        return None
    profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
    if not parser.has_section(profile):
        return None
    section = dict(parser.items(profile))
    if set(section) - {"aws_access_key_id", "aws_secret_access_key", "aws_session_token", "region"}:
        return None  # roles, processes, SSO: botocore's business
    if not section.get("aws_access_key_id") or not section.get("aws_secret_access_key"):
        return None
    return section["aws_access_key_id"], section["aws_secret_access_key"], section.get("aws_session_token") or None


def sign_v4(get: S3Get, now: datetime.datetime) -> dict[str, str]:
    """Headers of a GET of ``get`` signed with AWS Signature Version 4 (service s3, empty payload)."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    headers = {"host": get.host, "x-amz-content-sha256": _EMPTY_SHA256, "x-amz-date": amz_date}
    if get.credentials is None:
        return headers
    key_id, secret, token = get.credentials
    if token:
        headers["x-amz-security-token"] = token
    names = sorted(headers)
    canonical = "\n".join(
        [
            "GET",
            get.path,
            "",
            "".join(f"{n}:{headers[n].strip()}\n" for n in names),
            ";".join(names),
            _EMPTY_SHA256,
        ]
    )
    scope = f"{amz_date[:8]}/{get.region}/s3/aws4_request"
    to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
    k = _hmac(("AWS4" + secret).encode(), amz_date[:8])
    for part in (get.region, "s3", "aws4_request"):
        k = _hmac(k, part)
    signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def connect(get: S3Get, timeout: float) -> http.client.HTTPConnection:
    """A connection (not opened yet) to ``get``'s host: TLS with ``AWS_CA_BUNDLE`` when set, as botocore."""
    if get.scheme == "https":
        import ssl

        context = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)
        return http.client.HTTPSConnection(get.host, timeout=timeout, context=context)
    return http.client.HTTPConnection(get.host, timeout=timeout)


def fetch(get: S3Get, max_bytes: int, span: tuple[int, int] | None = None) -> bytes | None:
    """The body of a signed GET of ``get`` when it is 200 and at most ``max_bytes``, else None. With ``span =
    (start, end)``: bytes ``[start, end)`` (fewer where the object ends first), or None; ``max_bytes`` is then
    ``end - start``."""
    headers = sign_v4(get, datetime.datetime.now(datetime.timezone.utc))
    if span is not None:
        start, end = span
        if not 0 <= start < end:
            raise ValueError(f"bad span {span}")
        headers["range"] = f"bytes={start}-{end - 1}"  # unsigned: SigV4 signs only the headers it names
        max_bytes = end - start
    conn = connect(get, _TIMEOUT)
    try:
        conn.request("GET", get.path, headers=headers)  # the signed Host header, not http.client's own
        resp = conn.getresponse()
        body = resp.read(max_bytes + 1)
    finally:
        conn.close()
    if len(body) > max_bytes:
        return None
    if span is None:
        return body if resp.status == 200 else None
    if resp.status == 206:
        return body
    return body if resp.status == 200 and span[0] == 0 else None  # Range ignored: the whole object, if it fits
