"""JSON Lines input (plain, .gz, .zst): a token-id list field, or a text field with a tokenizer."""

from __future__ import annotations

import json
from collections.abc import Iterator

import fsspec
import numpy as np

from ..errors import InputFormatError
from .base import DocBatch, SourceOptions, Unit, batch_from_lists

__all__ = ["read_jsonl"]


def read_jsonl(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    field = options.text_column if options.tokenizer is not None else options.tokens_column
    pending: list = []
    try:
        with fsspec.open(
            unit.path, "rt", compression="infer", encoding="utf-8", **(options.storage_options or {})
        ) as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    value = record[field]
                except (json.JSONDecodeError, TypeError, KeyError) as exc:
                    raise InputFormatError(
                        f"{unit.path}:{lineno}: expected a JSON object with field {field!r} ({exc})"
                    ) from exc
                pending.append(_check(unit.path, lineno, field, value, options))
                if len(pending) >= options.batch_documents:
                    yield _flush(pending, options)
                    pending = []
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise InputFormatError(f"{unit.path}: cannot read as JSON Lines ({exc})") from exc
    if pending:
        yield _flush(pending, options)


def _check(path: str, lineno: int, field: str, value: object, options: SourceOptions) -> object:
    if options.tokenizer is not None:
        if not isinstance(value, str):
            raise InputFormatError(f"{path}:{lineno}: field {field!r} is not a string")
        return value
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputFormatError(f"{path}:{lineno}: field {field!r} is not a list of integer token ids")
    return np.asarray(value, dtype=np.int64)


def _flush(pending: list, options: SourceOptions) -> DocBatch:
    if options.tokenizer is not None:
        return batch_from_lists(options.tokenizer.encode_batch(pending))
    return batch_from_lists(pending)
