"""ferry's client side: the streaming loader (and, later, the HTTP client of the service).

``client`` imports ``shard_tools`` and never ``service``.
"""

from __future__ import annotations

from .dataset import TokenDataset
from .loader import TokenLoader
from .mixed import MixedDataset
from .service_client import ServiceClient

__all__ = ["TokenDataset", "MixedDataset", "TokenLoader", "ServiceClient"]
