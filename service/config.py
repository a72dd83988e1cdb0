"""``ferry.toml``: clusters, replication rules, limits, schedules and the API section, validated.

Parsing turns user input into frozen dataclasses with precise errors (ConfigError). Credentials
never live in the file: a secret-looking storage option must be an environment reference
(``"$NAME"`` or ``"${NAME}"``), resolved at load time, and :meth:`Cluster.public_url` strips
anything secret before a URL is shown.
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ferry.shard_tools.errors import ConfigError
from ferry.shard_tools.units import format_rate, parse_rate

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "Cluster",
    "Rule",
    "Limits",
    "ApiConfig",
    "parse_api",
    "Config",
    "load_config",
    "parse_config",
    "parse_rate",
    "format_rate",
    "link_name",
    "redact",
]

_SECRET_WORDS = ("secret", "password", "passwd", "token", "credential", "private_key", "sas", "connection_string")
_SECRET_KEYS = {"key", "access_key", "access_key_id", "aws_access_key_id", "account_key", "session_token"}
_ENV_REF = re.compile(r"^\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?$")
_KNOWN_SCHEMES = {"file", "local", "memory", "s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "hf", "hdfs", "webhdfs"}


def link_name(src: str, dst: str) -> str:
    """The name of a link between two clusters, as used in ``[limits.per_link]``: ``"SRC->DST"``."""
    return f"{src}->{dst}"


def _is_secret_key(key: str) -> bool:
    k = key.lower()
    return k in _SECRET_KEYS or any(w in k for w in _SECRET_WORDS)


def redact(url: str) -> str:
    """A URL without user info or query string (where tokens tend to hide)."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # a plain (or Windows) path
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _resolve_options(options: Mapping[str, Any], where: str, env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        if isinstance(value, Mapping):
            out[key] = _resolve_options(value, f"{where}.{key}", env)
            continue
        ref = _ENV_REF.match(value) if isinstance(value, str) else None
        if ref:
            name = ref.group(1)
            if name not in env:
                raise ConfigError(f"{where}.{key}: environment variable {name} is not set")
            out[key] = env[name]
        elif _is_secret_key(key):
            raise ConfigError(
                f"{where}.{key}: credentials must not be written in ferry.toml; "
                f'use an environment reference such as {key} = "$MY_{key.upper()}" or a profile'
            )
        else:
            out[key] = value
    return out


@dataclass(frozen=True)
class Cluster:
    """A named storage location; datasets live at ``<url>/<dataset name>``."""

    name: str
    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)
    priority: int = 100  # lower is nearer: replicas are tried in this order when pulling

    def dataset_url(self, dataset: str) -> str:
        return f"{self.url.rstrip('/')}/{dataset}"

    @property
    def public_url(self) -> str:
        return redact(self.url)


@dataclass(frozen=True)
class Rule:
    """Replicate datasets whose name matches ``datasets`` (a glob) from ``source`` to ``destinations``."""

    datasets: str
    source: str
    destinations: tuple[str, ...]

    def matches(self, dataset: str) -> bool:
        return fnmatch.fnmatchcase(dataset, self.datasets)


@dataclass(frozen=True)
class Limits:
    """Concurrency and bandwidth (bytes/s, None = unlimited); the daemon can change them at run time."""

    transfers: int = 4
    bwlimit: float | None = None
    per_link: Mapping[str, float | None] = field(default_factory=dict)  # "SRC->DST" -> bytes/s
    retries: int = 5  # attempts per shard within one pass before it is marked failed


@dataclass(frozen=True)
class ApiConfig:
    """``[api]``: the HTTP API and dashboard (the one type of this section; the API reads it as is)."""

    host: str = "127.0.0.1"
    port: int = 8765
    token_env: str = "FERRY_API_TOKEN"  # name of the env var holding the bearer token for mutating calls
    read_protected: bool = False  # True: reading needs the token too
    sla_minutes: float = 60.0  # a link lagging longer than this is flagged
    # Connections (see service/api/connections.py): the API's sockets stay well inside the process's
    # file descriptors, and a client that is slow or silent is closed after a bounded time.
    max_connections: int = 256  # open API sockets; at most half of RLIMIT_NOFILE (less the backlog)
    max_event_streams: int = 32  # concurrent /api/v1/events streams (each one costs every daemon event)
    backlog: int = 128  # the listening socket's accept queue
    header_timeout: float = 10.0  # seconds from a request's first byte (a connection's start) to its last header
    body_timeout: float = 10.0  # seconds from the last header to the last body byte
    send_timeout: float = 30.0  # seconds a response may sit unsent (the client reads nothing) before it is cut
    keep_alive_timeout: float = 5.0  # seconds an idle keep-alive connection stays open
    max_header_bytes: int = 32 * 1024  # request line + headers
    max_headers: int = 100  # header lines per request

    @property
    def token(self) -> str | None:
        """The bearer token from the environment (None where unset)."""
        return os.environ.get(self.token_env) or None


@dataclass(frozen=True)
class Config:
    """A whole ``ferry.toml``."""

    clusters: Mapping[str, Cluster]
    rules: tuple[Rule, ...]
    limits: Limits = field(default_factory=Limits)
    state_dir: Path = Path(".ferry-state")
    poll_interval: float = 30.0
    keep_versions: int = 3
    scrub_interval: float | None = None  # seconds; None = only on demand
    api: ApiConfig = field(default_factory=ApiConfig)
    source_path: Path | None = None
    cluster: str | None = None  # one daemon per cluster: act only where this cluster is the destination

    def links(self) -> list[tuple[str, str]]:
        """Every (source, destination) pair some rule names."""
        seen: dict[tuple[str, str], None] = {}
        for rule in self.rules:
            for dst in rule.destinations:
                seen[(rule.source, dst)] = None
        return list(seen)


def _check_keys(section: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")


def _number(value: Any, where: str, *, minimum: float = 0.0, integer: bool = False) -> Any:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok or isinstance(value, bool) or value < minimum:
        kind = "an integer" if integer else "a number"
        raise ConfigError(f"{where}: expected {kind} >= {minimum:g}, got {value!r}")
    return value


def _check_url(url: Any, where: str) -> str:
    if not isinstance(url, str) or not url.strip():
        raise ConfigError(f"{where}: url must be a non-empty string")
    parts = urlsplit(url)
    if parts.scheme and len(parts.scheme) > 1:
        if parts.scheme not in _KNOWN_SCHEMES and "::" not in url:
            import fsspec

            if parts.scheme not in fsspec.available_protocols():
                raise ConfigError(f"{where}: unknown URL scheme {parts.scheme!r} in {url!r}")
        if parts.username or parts.password:
            raise ConfigError(f"{where}: credentials must not be embedded in the URL; use the environment")
        if parts.scheme not in ("file", "local", "memory") and not (parts.netloc or parts.path.strip("/")):
            raise ConfigError(f"{where}: URL {url!r} names no bucket or path")
    return url


def parse_config(
    doc: Mapping[str, Any], *, base_dir: Path | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Validate a parsed ``ferry.toml`` mapping. Relative local paths are taken from ``base_dir``."""
    env = os.environ if env is None else env
    base = base_dir or Path.cwd()
    _check_keys(
        doc,
        {
            "clusters",
            "rules",
            "limits",
            "state_dir",
            "poll_interval",
            "keep_versions",
            "scrub_interval",
            "api",
            "cluster",
        },
        "ferry.toml",
    )
    clusters = _parse_clusters(doc.get("clusters"), base, env)
    rules = [_parse_rule(section, f"rules[{i}]", clusters) for i, section in enumerate(_rule_list(doc.get("rules")))]
    limits = _parse_limits(doc.get("limits", {}), clusters)
    api = parse_api(doc.get("api", {}))
    state_dir = Path(_string(doc.get("state_dir", ".ferry-state"), "state_dir"))
    if not state_dir.is_absolute():
        state_dir = (base / state_dir).resolve()
    scrub = doc.get("scrub_interval")
    return Config(
        clusters=clusters,
        rules=tuple(rules),
        limits=limits,
        state_dir=state_dir,
        poll_interval=float(_number(doc.get("poll_interval", 30.0), "poll_interval", minimum=0.01)),
        keep_versions=int(_number(doc.get("keep_versions", 3), "keep_versions", minimum=1, integer=True)),
        scrub_interval=None if scrub in (None, 0) else float(_number(scrub, "scrub_interval", minimum=1)),
        api=api,
        cluster=_own_cluster(doc.get("cluster"), clusters),
    )


def _parse_clusters(raw: Any, base: Path, env: Mapping[str, str]) -> dict[str, Cluster]:
    """``[clusters.NAME]`` sections; relative local URLs are taken from ``base``."""
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError("ferry.toml: [clusters.NAME] sections are required (at least two clusters)")
    clusters: dict[str, Cluster] = {}
    for name, section in raw.items():
        where = f"clusters.{name}"
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
            raise ConfigError(f"{where}: cluster names use letters, digits, '_', '.', '-'")
        if not isinstance(section, Mapping):
            raise ConfigError(f"{where}: expected a table")
        _check_keys(section, {"url", "storage_options", "priority"}, where)
        url = _check_url(section.get("url"), where)
        if "://" not in url and not Path(url).is_absolute():
            url = str((base / url).resolve())
        opts = section.get("storage_options", {})
        if not isinstance(opts, Mapping):
            raise ConfigError(f"{where}.storage_options: expected a table")
        priority = _number(section.get("priority", 100), f"{where}.priority", integer=True)
        clusters[name] = Cluster(name, url, _resolve_options(opts, f"{where}.storage_options", env), priority)
    return clusters


def _rule_list(raw: Any) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError("ferry.toml: at least one [[rules]] entry is required")
    return raw


def _parse_rule(section: Any, where: str, clusters: Mapping[str, Cluster]) -> Rule:
    """One ``[[rules]]`` entry: which datasets go from which cluster to which."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"{where}: expected a table")
    _check_keys(section, {"datasets", "from", "to"}, where)
    pattern = section.get("datasets", "*")
    if not isinstance(pattern, str) or not pattern or "/" in pattern:
        raise ConfigError(f"{where}.datasets: expected a glob of dataset names such as 'fineweb-*'")
    src = section.get("from")
    if src not in clusters:
        raise ConfigError(f"{where}.from: unknown cluster {src!r} (known: {', '.join(clusters)})")
    to = section.get("to")
    if to == "*":
        dsts = tuple(c for c in clusters if c != src)
    elif isinstance(to, list) and to and all(isinstance(t, str) for t in to):
        for t in to:
            if t not in clusters:
                raise ConfigError(f"{where}.to: unknown cluster {t!r} (known: {', '.join(clusters)})")
            if t == src:
                raise ConfigError(f"{where}.to: cluster {t!r} is also the source")
        dsts = tuple(dict.fromkeys(to))
    else:
        raise ConfigError(f'{where}.to: expected a list of cluster names or "*"')
    if not dsts:
        raise ConfigError(f"{where}: no destination clusters")
    return Rule(pattern, str(src), dsts)


def _own_cluster(value: Any, clusters: Mapping[str, Cluster]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or value not in clusters:
        raise ConfigError(f"cluster: {value!r} is not one of the configured clusters ({', '.join(clusters)})")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected a non-empty string")
    return value


def _parse_limits(section: Any, clusters: Mapping[str, Cluster]) -> Limits:
    if not isinstance(section, Mapping):
        raise ConfigError("limits: expected a table")
    _check_keys(section, {"transfers", "bwlimit", "per_link", "retries"}, "limits")
    per_link: dict[str, float | None] = {}
    raw = section.get("per_link", {})
    if not isinstance(raw, Mapping):
        raise ConfigError('limits.per_link: expected a table of "SRC->DST" = "rate"')
    for link, rate in raw.items():
        src, sep, dst = link.partition("->")
        if not sep or src.strip() not in clusters or dst.strip() not in clusters:
            raise ConfigError(f'limits.per_link: {link!r} is not "SRC->DST" with two known clusters')
        per_link[link_name(src.strip(), dst.strip())] = parse_rate(rate, f"limits.per_link.{link}")
    return Limits(
        transfers=int(_number(section.get("transfers", 4), "limits.transfers", minimum=1, integer=True)),
        bwlimit=parse_rate(section.get("bwlimit"), "limits.bwlimit"),
        per_link=per_link,
        retries=int(_number(section.get("retries", 5), "limits.retries", minimum=1, integer=True)),
    )


def parse_api(section: Any) -> ApiConfig:
    """Validate an ``[api]`` table."""
    if not isinstance(section, Mapping):
        raise ConfigError("api: expected a table")
    _check_keys(section, {"host", "port", "token_env", "read_protected", "sla_minutes", *_API_LIMITS}, "api")
    if "token" in section:  # pragma: no cover - caught by _check_keys; kept for the clearer message
        raise ConfigError("api.token: put the token in an environment variable and name it with token_env")
    read_protected = section.get("read_protected", False)
    if not isinstance(read_protected, bool):
        raise ConfigError("api.read_protected: expected true or false")
    return ApiConfig(
        host=_string(section.get("host", ApiConfig.host), "api.host"),
        port=_port(section.get("port", ApiConfig.port)),
        token_env=_string(section.get("token_env", ApiConfig.token_env), "api.token_env"),
        read_protected=read_protected,
        sla_minutes=float(_number(section.get("sla_minutes", ApiConfig.sla_minutes), "api.sla_minutes", minimum=0)),
        **_api_limits(section),
    )


# [api] connection limits: key -> (integer?, minimum); each must be > 0, a timeout a number of seconds
_API_LIMITS: dict[str, tuple[bool, float]] = {
    "max_connections": (True, 8),
    "max_event_streams": (True, 1),
    "backlog": (True, 1),
    "header_timeout": (False, 0.1),
    "body_timeout": (False, 0.1),
    "send_timeout": (False, 0.1),
    "keep_alive_timeout": (False, 0.1),
    "max_header_bytes": (True, 1024),
    "max_headers": (True, 8),
}


def _api_limits(section: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, (integer, minimum) in _API_LIMITS.items():
        value = _number(section.get(key, getattr(ApiConfig, key)), f"api.{key}", minimum=minimum, integer=integer)
        if not math.isfinite(value):
            raise ConfigError(f"api.{key}: expected a finite number, got {value!r}")
        out[key] = int(value) if integer else float(value)
    return out


def _port(value: Any) -> int:
    port = int(_number(value, "api.port", integer=True, minimum=0))
    if port > 65535:
        raise ConfigError(f"api.port: {port} is not a TCP port (0..65535)")
    return port


def load_config(path: str | Path, *, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate ``ferry.toml``; relative paths in it are relative to the file."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {p}: {exc.strerror or exc}") from exc
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML ({exc})") from exc
    cfg = parse_config(doc, base_dir=p.resolve().parent, env=env)
    from dataclasses import replace

    return replace(cfg, source_path=p.resolve())
