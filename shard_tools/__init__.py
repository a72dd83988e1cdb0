"""shard_tools — ferry's shard format, packing, inspection and verification."""

from __future__ import annotations

__version__ = "0.1.0"

from .dataset import Dataset, decode_stored_shard, load_manifest, open_dataset  # noqa: E402
from .errors import *  # noqa: E402,F403
from .errors import __all__ as _errors_all  # noqa: E402
from .export import export_megatron  # noqa: E402
from .manifest import Manifest, ShardInfo, ShardTable, Tokenizer  # noqa: E402
from .pack import PackOptions, PackResult, PartResult, merge_parts, pack, pack_documents, pack_part  # noqa: E402
from .verify import VerifyReport, verify  # noqa: E402

__all__ = [
    "__version__",
    "Dataset",
    "open_dataset",
    "load_manifest",
    "decode_stored_shard",
    "Manifest",
    "ShardInfo",
    "ShardTable",
    "Tokenizer",
    "PackOptions",
    "PackResult",
    "pack",
    "pack_documents",
    "pack_part",
    "merge_parts",
    "PartResult",
    "verify",
    "VerifyReport",
    "export_megatron",
    *_errors_all,
]
