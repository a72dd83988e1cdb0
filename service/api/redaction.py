"""Configured secrets never leave the API: every string it sends is scrubbed of them."""

from __future__ import annotations

from typing import Any

__all__ = ["secret_values", "Redactor"]


def secret_values(config: Any, token: str | None) -> list[str]:
    """Every credential-like string in the config: storage option values (not booleans/numbers) and the token."""
    out: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict) or hasattr(node, "items"):
            for value in node.values():
                walk(value)
        elif isinstance(node, str) and len(node) >= 4 and "://" not in node:
            out.add(node)

    for cluster in getattr(config, "clusters", {}).values():
        walk(dict(getattr(cluster, "storage_options", {}) or {}))
    if token:
        out.add(token)
    return sorted(out, key=len, reverse=True)


class Redactor:
    """Replaces each of ``secrets`` inside strings (longest first) by ``***``."""

    def __init__(self, secrets: list[str]) -> None:
        self._secrets = sorted(secrets, key=len, reverse=True)

    def clean(self, value: Any) -> Any:
        """``value`` with every secret inside its strings replaced (error messages may quote a backend's text)."""
        if isinstance(value, str):
            for s in self._secrets:
                if s in value:
                    value = value.replace(s, "***")
            return value
        if isinstance(value, dict):
            return {k: self.clean(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.clean(v) for v in value]
        return value
