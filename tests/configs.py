"""The one way tests write a ``ferry.toml``: dataclasses named after its sections, rendered as TOML.

Each key is spelled once, here (a field's name is its key; ``Rule.source`` is ``from``); a key left
None is not written, so ferry's own default applies. ``FerryToml.doc()`` is the mapping
``parse_config`` takes, ``text()`` the file, ``write(path)`` writes it::

    FerryToml(clusters={"src": Cluster(f"{root}/src"), "dst": Cluster(f"{root}/dst", priority=20)},
              rules=[Rule("src", ["dst"])], limits=Limits(transfers=2), api=Api(port=port)).write(path)
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Api", "Cluster", "FerryToml", "Limits", "Link", "Rule", "Staging", "Swarm", "Transfer", "toml_text"]


@dataclass(frozen=True)
class Cluster:
    """``[clusters.NAME]``."""

    url: str | Path
    priority: int | None = None
    storage_options: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Rule:
    """One ``[[rules]]`` entry: ``source`` is written as ``from``; ``to`` a list of clusters or ``"*"``."""

    source: str
    to: Sequence[str] | str
    datasets: str | None = None


@dataclass(frozen=True)
class Link:
    """One ``[[links]]`` entry: ``source`` is written as ``from``; ``capacity`` as ferry.toml writes rates."""

    source: str | Sequence[str]
    to: str | Sequence[str]
    capacity: str | float | None = None
    price_per_gb: float | None = None
    rtt: float | None = None


@dataclass(frozen=True)
class Limits:
    """``[limits]``; rates as ferry.toml writes them (``"100MiB/s"``) or bytes/s."""

    transfers: int | None = None
    bwlimit: str | float | None = None
    per_link: Mapping[str, str | float] | None = None
    retries: int | None = None


@dataclass(frozen=True)
class Transfer:
    """``[transfer]``: where copies run (``engine`` "threads" or "ray") and the Ray engine's settings."""

    engine: str | None = None
    address: str | None = None
    max_retries: int | None = None
    task_cpus: float | None = None
    node_bwlimit: str | float | None = None


@dataclass(frozen=True)
class Api:
    """``[api]``."""

    host: str | None = None
    port: int | None = None
    token_env: str | None = None
    read_protected: bool | None = None
    sla_minutes: float | None = None
    max_connections: int | None = None
    max_event_streams: int | None = None
    backlog: int | None = None
    header_timeout: float | None = None
    body_timeout: float | None = None
    send_timeout: float | None = None
    keep_alive_timeout: float | None = None
    max_header_bytes: int | None = None
    max_headers: int | None = None


@dataclass(frozen=True)
class Staging:
    """``[staging]``; sizes as ferry.toml writes them (``"10GiB"``) or bytes."""

    url: str | Path
    budget: str | int
    horizon: str | int
    interval: float | None = None
    storage_options: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Swarm:
    """``[swarm]``."""

    enabled: bool | None = None
    interval: float | None = None
    stale_after: float | None = None
    routed: bool | None = None
    budget: float | None = None


@dataclass(frozen=True)
class FerryToml:
    """A whole ``ferry.toml``."""

    clusters: Mapping[str, Cluster]
    rules: Sequence[Rule]
    links: Sequence[Link] | None = None
    limits: Limits | None = None
    transfer: Transfer | None = None
    api: Api | None = None
    state_dir: str | Path | None = None
    poll_interval: float | None = None
    keep_versions: int | None = None
    scrub_interval: float | None = None
    cluster: str | None = None
    staging: Staging | None = None
    swarm: Swarm | None = None

    def doc(self) -> dict[str, Any]:
        """The parsed form: what ``tomllib.loads(self.text())`` gives and ``parse_config`` takes."""
        return _plain(self)

    def text(self) -> str:
        return toml_text(self.doc())

    def write(self, path: Path) -> Path:
        path.write_text(self.text())
        return path


def _plain(value: Any) -> Any:
    """Dataclasses and mappings as dicts without None values; paths as strings; tuples as lists."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        pairs: Any = ((("from" if f.name == "source" else f.name), getattr(value, f.name))
                      for f in dataclasses.fields(value))  # fmt: skip
        return {key: _plain(v) for key, v in pairs if v is not None}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, Path) else value


def toml_text(doc: Mapping[str, Any]) -> str:
    """``doc`` as TOML: scalars first, then each table (``[a.b]``) and array of tables (``[[rules]]``)."""
    return "\n".join(_table(doc, ())).strip() + "\n"


def _table(doc: Mapping[str, Any], path: tuple[str, ...]) -> list[str]:
    lines = [f"{_key(k)} = {_value(v)}" for k, v in doc.items() if not _is_table(v) and not _is_tables(v)]
    for key, value in doc.items():
        if _is_table(value):
            lines += ["", f"[{'.'.join(_key(p) for p in (*path, key))}]", *_table(value, (*path, key))]
        elif _is_tables(value):
            for item in value:
                lines += ["", f"[[{'.'.join(_key(p) for p in (*path, key))}]]", *_table(item, (*path, key))]
    return lines


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_tables(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML for {value!r}")
