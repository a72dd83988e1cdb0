"""``ferry.toml``: clusters, replication rules, limits, schedules and the API section, validated.

Parsing turns user input into frozen dataclasses with precise errors (ConfigError) naming each key
path. Each key's type, default and range are checked by the pydantic models of
:mod:`ferry.service.config_schema`, imported only when a file is parsed (``ferry sync`` needs neither a
file nor pydantic); this module ties the sections together and resolves the environment. Credentials
never live in the file: a secret-looking storage option must be an environment reference
(``"$NAME"`` or ``"${NAME}"``), resolved at load time, and :meth:`Cluster.public_url` strips
anything secret before a URL is shown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ferry.shard_tools.errors import ConfigError, UsageError
from ferry.shard_tools.units import format_rate, parse_rate

from .config_types import (
    _ENV_REF,
    ApiConfig,
    Cluster,
    Config,
    Limits,
    LinkSpec,
    Rule,
    StagingConfig,
    SwarmConfig,
    TransferConfig,
    _is_secret_key,
    link_name,
    redact,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "Cluster",
    "Rule",
    "Limits",
    "LinkSpec",
    "TransferConfig",
    "ApiConfig",
    "StagingConfig",
    "SwarmConfig",
    "parse_api",
    "Config",
    "load_config",
    "parse_config",
    "parse_rate",
    "format_rate",
    "link_name",
    "redact",
]


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


def _schema() -> Any:
    """The pydantic models of ferry.toml (service/config_schema.py), loaded when a file is parsed."""
    try:
        from . import config_schema
    except ImportError as exc:
        if not (exc.name or "").startswith("pydantic"):
            raise
        raise UsageError(
            "reading ferry.toml needs the 'service' extra (pydantic): pip install 'ferry-data[service]'"
        ) from exc
    return config_schema


def parse_config(
    doc: Mapping[str, Any], *, base_dir: Path | None = None, env: Mapping[str, str] | None = None
) -> Config:
    """Validate a parsed ``ferry.toml`` mapping. Relative local paths are taken from ``base_dir``.

    Each key's type, default and range are the pydantic models' (service/config_schema.py); here the
    sections are tied together: a rule's and a link's clusters must exist, ``$NAME`` options come
    from ``env``, relative paths from ``base_dir``.
    """
    env = os.environ if env is None else env
    base = base_dir or Path.cwd()
    checked = _schema().check_file(doc)
    clusters = {name: _cluster(name, section, base, env) for name, section in checked.clusters.items()}
    state_dir = Path(checked.state_dir)
    if not state_dir.is_absolute():
        state_dir = (base / state_dir).resolve()
    if checked.cluster is not None and checked.cluster not in clusters:
        raise ConfigError(f"cluster: {checked.cluster!r} is not one of the configured clusters ({', '.join(clusters)})")
    return Config(
        clusters=clusters,
        rules=tuple(_rule(section, f"rules[{i}]", clusters) for i, section in enumerate(checked.rules)),
        limits=_limits(checked.limits, clusters),
        transfer=_transfer(checked.transfer, clusters),
        state_dir=state_dir,
        poll_interval=float(checked.poll_interval),
        keep_versions=checked.keep_versions,
        scrub_interval=None if checked.scrub_interval is None else float(checked.scrub_interval),
        api=ApiConfig(**checked.api.model_dump()),
        cluster=checked.cluster,
        staging=_staging(checked.staging, clusters, base, env),
        link_specs=_link_specs(checked.links, clusters),
        swarm=SwarmConfig(**checked.swarm.model_dump()),
    )


def _staging(section: Any, clusters: Mapping[str, Cluster], base: Path, env: Mapping[str, str]) -> StagingConfig | None:
    """A checked ``[staging]``: never inside a cluster (evicting a staged copy must never touch a replica)."""
    if section is None:
        return None
    url = section.url
    if "://" not in url and not Path(url).is_absolute():
        url = str((base / url).resolve())
    for name, cluster in clusters.items():
        a, b = url.rstrip("/") + "/", cluster.url.rstrip("/") + "/"
        if a.startswith(b) or b.startswith(a):
            raise ConfigError(f"staging.url: {redact(url)} overlaps cluster {name!r} ({cluster.public_url}): "
                              "staging evicts what it holds, so it must lie outside every cluster")  # fmt: skip
    options = _resolve_options(section.storage_options, "staging.storage_options", env)
    return StagingConfig(url, section.budget, section.horizon, float(section.interval), options)


def _cluster(name: str, section: Any, base: Path, env: Mapping[str, str]) -> Cluster:
    """A checked ``[clusters.NAME]``: a relative local URL is taken from ``base``, options from ``env``."""
    url = section.url
    if "://" not in url and not Path(url).is_absolute():
        url = str((base / url).resolve())
    options = _resolve_options(section.storage_options, f"clusters.{name}.storage_options", env)
    return Cluster(name, url, options, section.priority)


def _rule(section: Any, where: str, clusters: Mapping[str, Cluster]) -> Rule:
    """A checked ``[[rules]]`` entry whose clusters exist: which datasets go from which cluster to which."""
    src = section.source
    if src not in clusters:
        raise ConfigError(f"{where}.from: unknown cluster {src!r} (known: {', '.join(clusters)})")
    if section.to == "*":
        dsts = tuple(c for c in clusters if c != src)
    else:
        for t in section.to:
            if t not in clusters:
                raise ConfigError(f"{where}.to: unknown cluster {t!r} (known: {', '.join(clusters)})")
            if t == src:
                raise ConfigError(f"{where}.to: cluster {t!r} is also the source")
        dsts = tuple(dict.fromkeys(section.to))
    if not dsts:
        raise ConfigError(f"{where}: no destination clusters")
    return Rule(section.datasets, src, dsts)


def _limits(section: Any, clusters: Mapping[str, Cluster]) -> Limits:
    """A checked ``[limits]`` whose ``per_link`` names links between known clusters."""
    per_link: dict[str, float | None] = {}
    for link, rate in section.per_link.items():
        src, sep, dst = link.partition("->")
        if not sep or src.strip() not in clusters or dst.strip() not in clusters:
            raise ConfigError(f'limits.per_link: {link!r} is not "SRC->DST" with two known clusters')
        per_link[link_name(src.strip(), dst.strip())] = rate
    return Limits(transfers=section.transfers, bwlimit=section.bwlimit, per_link=per_link, retries=section.retries)


def _link_specs(sections: Any, clusters: Mapping[str, Cluster]) -> dict[tuple[str, str], LinkSpec]:
    """Checked ``[[links]]`` entries, expanded to one spec per (src, dst) pair; a later entry wins."""
    out: dict[tuple[str, str], LinkSpec] = {}
    for i, section in enumerate(sections):
        ends = []
        for key, names in (("from", section.source), ("to", section.to)):
            if names == "*":
                names = list(clusters)
            for n in names:
                if n not in clusters:
                    raise ConfigError(f"links[{i}].{key}: unknown cluster {n!r} (known: {', '.join(clusters)})")
            ends.append(names)
        for src in ends[0]:
            for dst in ends[1]:
                if src != dst:
                    out[(src, dst)] = LinkSpec(
                        src, dst, section.capacity, float(section.price_per_gb), float(section.rtt)
                    )
    return out


def _transfer(section: Any, clusters: Mapping[str, Cluster]) -> TransferConfig:
    """A checked ``[transfer]``; the Ray engine's tasks reach every cluster from other processes and
    nodes, so none of the clusters may live in the daemon's memory."""
    if section.engine == "ray":
        for c in clusters.values():
            if c.url.startswith("memory://"):
                raise ConfigError(
                    f'transfer.engine: "ray" copies in other processes, which cannot see cluster {c.name!r} '
                    f"({c.url}: this process' memory); use storage every node reaches"
                )
    return TransferConfig(**section.model_dump())


def parse_api(section: Any) -> ApiConfig:
    """Validate an ``[api]`` table."""
    return ApiConfig(**_schema().check_api(section).model_dump())


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
