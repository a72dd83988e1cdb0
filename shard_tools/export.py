"""``ferry export``: a dataset's documents back to a Megatron ``.bin``/``.idx`` pair."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .dataset import open_dataset
from .errors import StorageError
from .format.megatron import write_megatron

__all__ = ["export_megatron"]


def export_megatron(
    url: str, prefix: str, *, storage_options: Mapping[str, Any] | None = None, keep_eos: bool = True
) -> int:
    """Write every document of ``url`` to ``prefix.bin``/``prefix.idx``; returns the document count.

    With ``keep_eos`` (Megatron's ``--append-eod`` convention) documents keep the EOS that
    packing appended; without it they are exactly the tokens that were packed.
    """
    ds = open_dataset(url, storage_options=storage_options)
    dtype = np.dtype(ds.manifest.token_dtype)
    if dtype == np.uint32 and ds.manifest.tokenizer.vocab_size <= 2**31:
        dtype = np.dtype(np.int32)  # Megatron has no uint32 code; it keeps large vocabularies as int32
    try:
        return write_megatron(prefix, ds.documents(strip_eos=not keep_eos), dtype)
    except OSError as exc:  # the dataset's own read errors are FerryErrors: this is the export side
        raise StorageError(
            f"cannot write {prefix}.bin/.idx ({exc}); check the --out directory", retryable=False
        ) from exc
