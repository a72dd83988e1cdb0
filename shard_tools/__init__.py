"""shard_tools — ferry's shard format, packing, inspection and verification."""

from __future__ import annotations

__version__ = "0.1.0"

from .dataset import Dataset, open_dataset  # noqa: E402
from .errors import *  # noqa: E402,F403
from .errors import __all__ as _errors_all  # noqa: E402
from .export import export_megatron  # noqa: E402
from .manifest import Manifest, ShardInfo, ShardTable, Tokenizer  # noqa: E402
from .pack import PackOptions, PackResult, pack, pack_documents  # noqa: E402
from .verify import VerifyReport, verify  # noqa: E402

__all__ = [
    "__version__",
    "Dataset",
    "open_dataset",
    "Manifest",
    "ShardInfo",
    "ShardTable",
    "Tokenizer",
    "PackOptions",
    "PackResult",
    "pack",
    "pack_documents",
    "verify",
    "VerifyReport",
    "export_megatron",
    *_errors_all,
]
