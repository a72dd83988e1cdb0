"""The API's ``[api]`` settings. The one type is ``ferry.service.config.ApiConfig`` (defaults, parsing and
validation live there); this module only accepts what callers hand the API and reads the token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ferry.shard_tools.errors import ConfigError

from ..config import ApiConfig, parse_api

__all__ = ["ApiSettings", "api_config_of", "resolve_token"]

#: the exported name of ``[api]``'s one type
ApiSettings = ApiConfig


def api_config_of(cfg: Any) -> ApiConfig:
    """``cfg`` as an ApiConfig: None (the defaults), an ApiConfig, a whole ``Config``, or an ``[api]`` mapping."""
    if cfg is None:
        return ApiConfig()
    if isinstance(cfg, ApiConfig):
        return cfg
    if isinstance(cfg, Mapping):
        return parse_api(cfg)
    api = getattr(cfg, "api", None)
    if isinstance(api, ApiConfig):
        return api
    raise ConfigError(f"[api]: expected a table or an ApiConfig, got {type(cfg).__name__}")


def resolve_token(cfg: ApiConfig) -> str | None:
    """The bearer token (read once from ``cfg.token_env``); refuses protected reads without one."""
    token = cfg.token
    if cfg.read_protected and not token:
        raise ConfigError(f"[api] protects reads but no token is set (set the environment variable {cfg.token_env})")
    return token
