"""Plain text input: one document per file, or one per line (``text_per_line``)."""

from __future__ import annotations

from collections.abc import Iterator

import fsspec

from ..errors import InputFormatError, UsageError
from .base import READ_ERRORS, DocBatch, SourceOptions, Unit, batch_from_lists

__all__ = ["read_text"]

_ERRORS: tuple[type[BaseException], ...] = (*READ_ERRORS, UnicodeDecodeError)


def read_text(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    tokenizer = options.tokenizer
    if tokenizer is None:
        raise UsageError(f"{unit.path}: text input needs a tokenizer (--tokenizer bytes or a tokenizer.json)")
    try:
        with fsspec.open(
            unit.path, "rt", compression="infer", encoding="utf-8", **(options.storage_options or {})
        ) as f:
            if not options.text_per_line:
                yield batch_from_lists(tokenizer.encode_batch([f.read()]))
                return
            pending: list[str] = []
            for line in f:
                line = line.rstrip("\r\n")
                if not line:
                    continue
                pending.append(line)
                if len(pending) >= options.batch_documents:
                    yield batch_from_lists(tokenizer.encode_batch(pending))
                    pending = []
            if pending:
                yield batch_from_lists(tokenizer.encode_batch(pending))
    except _ERRORS as exc:
        raise InputFormatError(f"{unit.path}: cannot read as UTF-8 text ({exc})") from exc
