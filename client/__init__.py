"""ferry's client side: the streaming loader (and, later, the HTTP client of the service).

``client`` imports ``shard_tools`` and never ``service``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .media.dataset import MediaDataset
    from .media.loader import MediaLoader
    from .media.mixed import MediaMixture
    from .service.service_client import ServiceClient
    from .stream.dataset import TokenDataset
    from .stream.loader import TokenLoader
    from .stream.mixed import MixedDataset

__all__ = [
    "TokenDataset",
    "MixedDataset",
    "TokenLoader",
    "MediaDataset",
    "MediaMixture",
    "MediaLoader",
    "ServiceClient",
]

# Imported on first use (PEP 562): `ferry status` and ServiceClient need no torch, and every `ferry`
# command loads client.service.cli, which would otherwise pay torch's multi-second import.
_LAZY = {
    "TokenDataset": ".stream.dataset",
    "TokenLoader": ".stream.loader",
    "MixedDataset": ".stream.mixed",
    "MediaDataset": ".media.dataset",
    "MediaLoader": ".media.loader",
    "MediaMixture": ".media.mixed",
    "ServiceClient": ".service.service_client",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
