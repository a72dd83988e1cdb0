"""shard_tools — ferry's shard format, packing, inspection and verification.

The public names below load on first use (PEP 562), so ``ferry sync``, the loader and the
service import only the modules they need — a no-op resync does not pay for numpy and
pyarrow. ``from ferry.shard_tools import pack`` works as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import *  # noqa: F403 — the error hierarchy is small and always needed
from .errors import __all__ as _errors_all
from .lazy import lazy_attributes

__version__ = "0.1.0"

# public name → the module that defines it
_LAZY = {
    "Dataset": "dataset",
    "open_dataset": "dataset",
    "load_manifest": "dataset",
    "decode_stored_shard": "dataset",
    "Manifest": "format.manifest",
    "ShardInfo": "format.manifest",
    "ShardTable": "format.manifest",
    "Tokenizer": "format.manifest",
    "PackOptions": "packer.packing",
    "PackResult": "packer.packing",
    "PartResult": "packer.packing",
    "pack": "packer.packing",
    "pack_documents": "packer.packing",
    "pack_part": "packer.packing",
    "merge_parts": "packer.packing",
    "verify": "verification",
    "VerifyReport": "verification",
    "export_megatron": "export",
}

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

if TYPE_CHECKING:
    from .dataset import Dataset, decode_stored_shard, load_manifest, open_dataset
    from .export import export_megatron
    from .format.manifest import Manifest, ShardInfo, ShardTable, Tokenizer
    from .packer.packing import PackOptions, PackResult, PartResult, merge_parts, pack, pack_documents, pack_part
    from .verification import VerifyReport, verify


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)
