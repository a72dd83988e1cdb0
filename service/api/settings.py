"""The API's own settings (token, read protection, bind address, SLA), read from the config's ``[api]``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from shard_tools.errors import ConfigError

__all__ = ["ApiSettings"]


@dataclass(frozen=True, kw_only=True)
class ApiSettings:
    """Resolved API settings. ``token`` is the secret itself (already read from its env var), never logged."""

    token: str | None = None
    read_protected: bool = False
    host: str = "127.0.0.1"
    port: int = 8470
    sla_minutes: float = 60.0

    def __repr__(self) -> str:  # keep the token out of any log or traceback
        return (
            f"ApiSettings(token={'***' if self.token else None}, read_protected={self.read_protected}, "
            f"host={self.host!r}, port={self.port}, sla_minutes={self.sla_minutes})"
        )

    __str__ = __repr__

    @classmethod
    def from_config(cls, cfg: Any) -> ApiSettings:
        """Accept an ``ApiSettings``, a mapping, or the replication config's ``[api]`` object (duck-typed)."""
        if cfg is None:
            return cls()
        if isinstance(cfg, ApiSettings):
            return cfg

        def get(name: str, default: Any = None) -> Any:
            if isinstance(cfg, dict):
                return cfg.get(name, default)
            return getattr(cfg, name, default)

        token = get("token")
        env_name = get("token_env")
        if token is None and env_name:
            token = os.environ.get(str(env_name)) or None
        read_protected = get("read_protected")
        if read_protected is None:
            read_protected = get("protect_reads", False)
        settings = cls(
            token=token,
            read_protected=bool(read_protected),
            host=str(get("host", "127.0.0.1")),
            port=int(get("port", 8470)),
            sla_minutes=float(get("sla_minutes", 60.0)),
        )
        if settings.read_protected and not settings.token:
            raise ConfigError("[api] protects reads but no token is set (set the token's environment variable)")
        if not 0 <= settings.port <= 65535:
            raise ConfigError(f"[api] port {settings.port} is not a TCP port")
        return settings
