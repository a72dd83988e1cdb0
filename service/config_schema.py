"""The shape of ``ferry.toml`` as pydantic models: every key, its type, default and range.

:func:`check_file` and :func:`check_api` validate a parsed document (strict types: ``"8"`` is not an
integer, ``1`` is not ``true``; numbers finite; unknown keys refused) and turn pydantic's errors into
one :class:`~ferry.shard_tools.errors.ConfigError` naming each key path (``limits.transfers: must be
>= 1, got 0``). How sections refer to each other (a rule's clusters, a link's clusters) and what
needs the environment or the file's directory is :mod:`ferry.service.config`'s part, which imports
this module only when a file is parsed: ``ferry sync`` runs without pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from ferry.shard_tools.errors import ConfigError, UsageError
from ferry.shard_tools.units import parse_rate, parse_size

from .config_types import ApiConfig, Cluster, Config, Limits, SwarmConfig, TransferConfig, url_problem

__all__ = [
    "FileSection",
    "ClusterSection",
    "RuleSection",
    "LimitsSection",
    "TransferSection",
    "ApiSection",
    "StagingSection",
    "LinkSection",
    "SwarmSection",
    "check_file",
    "check_api",
]

_MAX_LISTED = 10  # problems listed in one error; the rest are counted


def _cluster_name(name: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ValueError("cluster names use letters, digits, '_', '.', '-'")
    return name


def _url(url: str) -> str:
    if not url.strip():
        raise ValueError("must be a non-empty string")
    problem = url_problem(url)
    if problem:
        raise ValueError(problem)
    return url


def _glob(pattern: str) -> str:
    if not pattern or "/" in pattern:
        raise ValueError(f"expected a glob of dataset names such as 'fineweb-*', got {pattern!r}")
    return pattern


def _destinations(value: Any) -> Any:
    if value == "*" or (isinstance(value, list) and value and all(isinstance(t, str) for t in value)):
        return value
    raise ValueError('expected a list of cluster names or "*"')


def _rate(value: Any) -> Any:
    """A rate as :func:`parse_rate` reads it (``"100MiB/s"``, bytes/s, ``"off"``) → bytes/s or None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value or None  # bytes/s, 0 = unlimited; the float schema checks it is finite and >= 0
    try:
        return parse_rate(value)
    except ConfigError as exc:
        raise ValueError(str(exc).partition(": ")[2]) from None


ClusterName = Annotated[str, AfterValidator(_cluster_name)]
Rate = Annotated[Annotated[float, Field(ge=0)] | None, BeforeValidator(_rate)]


class _Section(BaseModel):
    """A TOML table: exact types, finite numbers, no key the model does not name."""

    model_config = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, frozen=True)


class ClusterSection(_Section):
    url: Annotated[str, AfterValidator(_url)]
    storage_options: dict[str, Any] = Field(default_factory=dict)
    priority: int = Field(default=Cluster.priority, ge=0)


class RuleSection(_Section):
    datasets: Annotated[str, AfterValidator(_glob)] = "*"
    source: str = Field(alias="from")
    to: Annotated[Literal["*"] | list[str], BeforeValidator(_destinations)]


class LimitsSection(_Section):
    transfers: int = Field(default=Limits.transfers, ge=1)
    bwlimit: Rate = None
    per_link: dict[str, Rate] = Field(default_factory=dict)
    retries: int = Field(default=Limits.retries, ge=1)


def _ray_address(address: str) -> str:
    """``"auto"``, ``"HOST:PORT"`` or ``"ray://HOST:PORT"`` (what ``ray.init(address=...)`` takes)."""
    rest = address[len("ray://") :] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if address == "auto" or (sep and host and port.isdigit() and 0 < int(port) < 65536 and "/" not in host):
        return address
    raise ValueError(f'expected "auto", "HOST:PORT" or "ray://HOST:PORT", got {address!r}')


class TransferSection(_Section):
    """``[transfer]``; defaults are :class:`TransferConfig`'s."""

    engine: Literal["threads", "ray"] = "threads"
    address: Annotated[str, AfterValidator(_ray_address)] = TransferConfig.address
    max_retries: int = Field(default=TransferConfig.max_retries, ge=0)
    task_cpus: float = Field(default=TransferConfig.task_cpus, ge=0)
    node_bwlimit: Rate = None


class ApiSection(_Section):
    """``[api]``; defaults are :class:`ApiConfig`'s. The connection bounds keep the API's sockets and
    timeouts usable (see service/api/connections.py)."""

    host: str = Field(default=ApiConfig.host, min_length=1)
    port: int = Field(default=ApiConfig.port, ge=0, le=65535)
    token_env: str = Field(default=ApiConfig.token_env, min_length=1)
    read_protected: bool = ApiConfig.read_protected
    sla_minutes: float = Field(default=ApiConfig.sla_minutes, ge=0)
    max_connections: int = Field(default=ApiConfig.max_connections, ge=8)
    max_event_streams: int = Field(default=ApiConfig.max_event_streams, ge=1)
    backlog: int = Field(default=ApiConfig.backlog, ge=1)
    header_timeout: float = Field(default=ApiConfig.header_timeout, ge=0.1)
    body_timeout: float = Field(default=ApiConfig.body_timeout, ge=0.1)
    send_timeout: float = Field(default=ApiConfig.send_timeout, ge=0.1)
    keep_alive_timeout: float = Field(default=ApiConfig.keep_alive_timeout, ge=0.1)
    max_header_bytes: int = Field(default=ApiConfig.max_header_bytes, ge=1024)
    max_headers: int = Field(default=ApiConfig.max_headers, ge=8)


def _size(value: Any) -> Any:
    """A size as ``parse_size`` reads it (``"100GiB"`` or bytes)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return parse_size(value)
    except (UsageError, AttributeError) as exc:
        raise ValueError(f"expected a size such as '100GiB' or a number of bytes ({exc})") from None


Size = Annotated[Annotated[int, Field(ge=1)], BeforeValidator(_size)]


class StagingSection(_Section):
    url: Annotated[str, AfterValidator(_url)]
    budget: Size
    horizon: Size
    interval: float = Field(default=2.0, ge=0.05)
    storage_options: dict[str, Any] = Field(default_factory=dict)


def _ends(value: Any) -> Any:
    """A cluster name, a list of them, or ``"*"`` (every cluster)."""
    if isinstance(value, str) and value:
        return value if value == "*" else [value]
    return _destinations(value)


class LinkSection(_Section):
    """A ``[[links]]`` entry: every link from a cluster in ``from`` to one in ``to`` (names, lists or ``"*"``);
    a later entry overrides an earlier one for the same link."""

    source: Annotated[Literal["*"] | list[str], BeforeValidator(_ends)] = Field(alias="from")
    to: Annotated[Literal["*"] | list[str], BeforeValidator(_ends)]
    capacity: Rate = None
    price_per_gb: float = Field(default=0.0, ge=0)
    rtt: float = Field(default=0.0, ge=0)


class SwarmSection(_Section):
    """``[swarm]``; defaults are :class:`SwarmConfig`'s."""

    enabled: bool = SwarmConfig.enabled
    interval: float = Field(default=SwarmConfig.interval, ge=0.05, le=3600)
    stale_after: float = Field(default=SwarmConfig.stale_after, ge=1)
    routed: bool = SwarmConfig.routed
    budget: float | None = Field(default=SwarmConfig.budget, ge=0)

    @model_validator(mode="after")
    def _routed_needs_the_swarm(self) -> SwarmSection:
        if self.routed and not self.enabled:
            raise ValueError("routed = true needs enabled = true (a routed fill is a swarm fill)")
        if self.budget is not None and not self.routed:
            raise ValueError("budget is the routed plan's: it needs routed = true")
        return self


class FileSection(_Section):
    """A whole ``ferry.toml``; defaults are :class:`Config`'s."""

    clusters: dict[ClusterName, ClusterSection] = Field(default_factory=dict, validate_default=True)
    rules: list[RuleSection] = Field(default_factory=list, validate_default=True)
    limits: LimitsSection = LimitsSection()  # frozen: one shared default is safe
    transfer: TransferSection = TransferSection()
    state_dir: str = Field(default=str(Config.state_dir), min_length=1)
    poll_interval: float = Field(default=Config.poll_interval, ge=0.01)
    keep_versions: int = Field(default=Config.keep_versions, ge=1)
    scrub_interval: float | None = None
    api: ApiSection = ApiSection()
    cluster: str | None = None
    staging: StagingSection | None = None
    links: list[LinkSection] = Field(default_factory=list)
    swarm: SwarmSection = SwarmSection()

    @field_validator("clusters")
    @classmethod
    def _some_clusters(cls, clusters: dict[str, ClusterSection]) -> dict[str, ClusterSection]:
        if not clusters:
            raise ValueError("[clusters.NAME] sections are required (at least two clusters)")
        return clusters

    @field_validator("rules")
    @classmethod
    def _some_rules(cls, rules: list[RuleSection]) -> list[RuleSection]:
        if not rules:
            raise ValueError("at least one [[rules]] entry is required")
        return rules

    @field_validator("scrub_interval")
    @classmethod
    def _scrub_interval(cls, seconds: float | None) -> float | None:
        if seconds == 0:
            return None  # 0: only on demand, as when the key is absent
        if seconds is not None and seconds < 1:
            raise ValueError(f"expected 0 (only on demand) or a number of seconds >= 1, got {seconds!r}")
        return seconds


def check_file(doc: Any) -> FileSection:
    """``doc`` (a parsed ``ferry.toml``) checked against :class:`FileSection`, or a ConfigError."""
    return _check(FileSection, doc, ())


def check_api(section: Any) -> ApiSection:
    """An ``[api]`` table checked against :class:`ApiSection`, or a ConfigError naming ``api.KEY``."""
    return _check(ApiSection, section, ("api",))


def _check(model: type[Any], doc: Any, prefix: tuple[str, ...]) -> Any:
    if isinstance(doc, Mapping) and not isinstance(doc, dict):
        doc = dict(doc)
    try:
        return model.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(_report(model, exc, prefix)) from None


# Unknown keys that people write for a reason: what to do instead.
_HINTS = {("api", "token"): "put the token in an environment variable and name it with token_env"}
_MESSAGES = {
    "missing": "required key is missing",
    "int_type": "expected an integer",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "list_type": "expected a list",
    "finite_number": "expected a finite number",
    "greater_than_equal": "must be >= {ge}",
    "less_than_equal": "must be <= {le}",
    "string_too_short": "must be a non-empty string",
}


def _report(model: type[BaseModel], exc: ValidationError, prefix: tuple[str, ...]) -> str:
    """One line per problem, each naming its key path; never pydantic's own dump."""
    lines: list[str] = []
    unknown: dict[tuple[Any, ...], list[str]] = {}
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if p != "[key]")  # a dict key's own error: the key is the path
        if err["type"] == "extra_forbidden":
            unknown.setdefault(loc[:-1], []).append(str(loc[-1]))
            continue
        lines.append(f"{_path(prefix + loc)}: {_message(err, loc)}")
    for parent, keys in unknown.items():
        hint = _HINTS.get((*prefix, *parent, keys[0])) if len(keys) == 1 else None
        if hint:
            lines.append(f"{_path(prefix + parent + (keys[0],))}: unknown key; {hint}")
            continue
        allowed = ", ".join(_keys_at(model, parent))
        lines.append(f"{_path(prefix + parent)}: unknown key(s) {', '.join(sorted(keys))} (allowed: {allowed})")
    if len(lines) == 1:
        return lines[0]
    more = [f"... and {len(lines) - _MAX_LISTED} more"] if len(lines) > _MAX_LISTED else []
    return "\n  ".join([f"{len(lines)} problems in ferry.toml", *lines[:_MAX_LISTED], *more])


def _path(loc: Sequence[Any]) -> str:
    """``("rules", 0, "to")`` → ``rules[0].to``; the empty path is the file itself."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or "ferry.toml"


def _message(err: Any, loc: tuple[Any, ...]) -> str:
    ctx = err.get("ctx") or {}
    if err["type"] == "value_error" and "error" in ctx:
        return str(ctx["error"])
    text = _MESSAGES.get(err["type"])
    if text is None:
        return str(err["msg"])
    text = text.format(**{k: f"{v:g}" if isinstance(v, float) else v for k, v in ctx.items()})
    value = err.get("input")
    shown = isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 80)
    if shown and err["type"] != "missing" and "storage_options" not in loc:  # options may hold secrets
        text += f", got {value!r}"
    return text


def _keys_at(model: Any, loc: tuple[Any, ...]) -> list[str]:
    """The keys the table at ``loc`` may hold: walk the models (a dict key or a list index selects
    the value type)."""
    for part in loc:
        if isinstance(model, type) and issubclass(model, BaseModel):
            field = next(f for name, f in model.model_fields.items() if (f.alias or name) == part)
            model = field.annotation
        else:
            model = get_args(model)[-1]
    return sorted(f.alias or name for name, f in model.model_fields.items())
