"""The typed sections of ``ferry.toml`` (frozen dataclasses with their defaults) and the URL rules they
share: what :mod:`ferry.service.config` builds from a file and :mod:`ferry.service.config_schema` takes its
defaults from. Credentials never live in the file: :meth:`Cluster.public_url` strips anything secret
before a URL is shown (:func:`redact`).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "Cluster",
    "Rule",
    "LinkSpec",
    "Limits",
    "TransferConfig",
    "SwarmConfig",
    "ApiConfig",
    "Config",
    "url_problem",
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
class LinkSpec:
    """``[[links]]``: what the network between two clusters offers, for the route planner
    (:mod:`ferry.service.replication.routes`): capacity in bytes/s (None = unknown, unbounded), egress
    price in $ per GB (10⁹ bytes) sent from ``src`` to ``dst``, round-trip time in seconds."""

    src: str
    dst: str
    capacity: float | None = None
    price_per_gb: float = 0.0
    rtt: float = 0.0


@dataclass(frozen=True)
class Limits:
    """Concurrency and bandwidth (bytes/s, None = unlimited); the daemon can change them at run time."""

    transfers: int = 4
    bwlimit: float | None = None
    per_link: Mapping[str, float | None] = field(default_factory=dict)  # "SRC->DST" -> bytes/s
    retries: int = 5  # attempts per shard within one pass before it is marked failed


@dataclass(frozen=True)
class TransferConfig:
    """``[transfer]``: where the copies run. ``threads``: in the daemon's own process; ``ray``: as Ray tasks
    spread over the nodes of the Ray cluster at ``address`` (the daemon still plans, records and publishes)."""

    engine: str = "threads"  # "threads" | "ray"
    address: str = "auto"  # ray: "auto" (the cluster this machine belongs to), "HOST:PORT" or "ray://HOST:PORT"
    max_retries: int = 3  # ray: times a copy task is run again after its worker or node died
    task_cpus: float = 1.0  # ray: CPUs one copy task reserves on its node
    node_bwlimit: float | None = None  # bytes/s that all copies on one node take together (None = unlimited)


@dataclass(frozen=True)
class SwarmConfig:
    """``[swarm]``: a destination filling a version offers its verified shards to the other clusters filling
    it (``swarm/<version>.json`` beside the dataset) and pulls each missing shard from any cluster holding it
    verified, the rule's source being only one of them. Off by default: a cluster serves a version only once
    it published it."""

    enabled: bool = False
    interval: float = 1.0  # seconds between two writes of this cluster's verified set, and two reads of peers'
    stale_after: float = 5.0  # a peer's set older than this: its in-flight shards are no longer waited for
    routed: bool = False  # each shard from the source the route planner picks over [[links]] (capacity, price)
    budget: float | None = None  # routed: $ of link egress the fleet may spend on one version's copies


@dataclass(frozen=True)
class StagingConfig:
    """``[staging]``: copy the shards registered jobs will read, in their read order, to a fast location."""

    url: str  # fsspec URL; dataset NAME is staged at <url>/NAME (a partial replica the loader reads first)
    budget: int  # bytes staging may hold
    horizon: int  # bytes of each job's coming shards to hold ahead of it
    interval: float = 2.0  # seconds between two plans
    storage_options: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def dataset_url(self, dataset: str) -> str:
        return f"{self.url.rstrip('/')}/{dataset}"


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
    header_timeout: float = 10.0  # seconds from a request's first byte (a connection's acceptance) to its last header
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
    transfer: TransferConfig = field(default_factory=TransferConfig)
    state_dir: Path = Path(".ferry-state")
    poll_interval: float = 30.0
    keep_versions: int = 3
    scrub_interval: float | None = None  # seconds; None = only on demand
    api: ApiConfig = field(default_factory=ApiConfig)
    source_path: Path | None = None
    cluster: str | None = None  # one daemon per cluster: act only where this cluster is the destination
    staging: StagingConfig | None = None  # None: jobs are listed, nothing is staged
    link_specs: Mapping[tuple[str, str], LinkSpec] = field(default_factory=dict)  # [[links]], by (src, dst)
    swarm: SwarmConfig = field(default_factory=SwarmConfig)

    def links(self) -> list[tuple[str, str]]:
        """Every (source, destination) pair some rule names."""
        seen: dict[tuple[str, str], None] = {}
        for rule in self.rules:
            for dst in rule.destinations:
                seen[(rule.source, dst)] = None
        return list(seen)


def url_problem(url: str) -> str | None:
    """What is wrong with a cluster's URL (an unknown scheme, embedded credentials, no bucket), or None."""
    parts = urlsplit(url)
    if not parts.scheme or len(parts.scheme) == 1:  # a plain (or Windows) path
        return None
    if parts.scheme not in _KNOWN_SCHEMES and "::" not in url:
        import fsspec

        if parts.scheme not in fsspec.available_protocols():
            return f"unknown URL scheme {parts.scheme!r} in {redact(url)!r}"
    if parts.username or parts.password:
        return "credentials must not be embedded in the URL; use the environment"
    if parts.scheme not in ("file", "local", "memory") and not (parts.netloc or parts.path.strip("/")):
        return f"URL {redact(url)!r} names no bucket or path"
    return None
