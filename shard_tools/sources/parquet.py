"""Parquet input: a list-of-int column of token ids, or a text column with a tokenizer; a whole
file or a run of its row groups."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from ..errors import InputFormatError
from .base import DocBatch, SourceOptions, Unit, batch_from_lists
from .mediatable import check_media_column, media_batches

__all__ = ["read_parquet", "find_column"]

_MEDIA_ROWS = 256


def read_parquet(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    column = options.text_column if options.tokenizer is not None else options.tokens_column
    try:
        with _open(unit.path, options) as f:
            pf = pq.ParquetFile(f)
            groups = None if unit.stop is None else _row_groups(unit, pf.metadata.num_row_groups)
            if options.media is not None:  # images (bytes or Image structs) and their text
                names = pf.schema_arrow.names
                check_media_column(unit.path, options, names)
                columns = [options.media_column] + ([options.text_column] if options.text_column in names else [])
                rows = min(options.batch_documents, _MEDIA_ROWS)  # rows of images read at once
                batches = pf.iter_batches(columns=columns, batch_size=rows, row_groups=groups)
                yield from media_batches(unit.path, batches, options, unit.first_document or 0)
                return
            find_column(unit.path, column, pf.schema_arrow.names)
            for batch in pf.iter_batches(columns=[column], batch_size=options.batch_documents, row_groups=groups):
                yield _convert(unit.path, column, batch.column(0), options)
    except (pa.ArrowException, OSError) as exc:
        raise InputFormatError(f"{unit.path}: not a readable Parquet file ({exc})") from exc


def find_column(path: str, column: str, names: list[str]) -> int:
    """The index of ``column`` among a file's columns; missing, or named twice (Arrow and Parquet
    allow that, and a reader would take one of the two unsaid), is an InputFormatError."""
    if column not in names:
        raise InputFormatError(
            f"{path}: no column {column!r} (columns: {', '.join(names)}); use --tokens-column / --text-column"
        )
    if names.count(column) > 1:
        raise InputFormatError(f"{path}: {names.count(column)} columns are named {column!r}; which to read is unclear")
    return names.index(column)


def _row_groups(unit: Unit, count: int) -> list[int]:
    """The row groups of a split unit, checked against the file (which may have changed since)."""
    assert unit.stop is not None
    if not 0 <= unit.start < unit.stop <= count:
        raise InputFormatError(
            f"{unit.path}: has {count} row groups, the plan asked for [{unit.start}:{unit.stop}]; "
            "did it change during the pack? Rerun it"
        )
    return list(range(unit.start, unit.stop))


def _open(path: str, options: SourceOptions) -> Any:
    """A native Arrow file for local paths (no Python in the read path), else an fsspec file."""
    fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
    if isinstance(fs, LocalFileSystem):
        return pa.OSFile(root, "rb")
    return fs.open(root, "rb")


def _convert(path: str, column: str, arr: pa.Array, options: SourceOptions) -> DocBatch:
    if arr.null_count:
        raise InputFormatError(f"{path}: column {column!r} has null values")
    if options.tokenizer is not None:
        if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
            raise InputFormatError(f"{path}: text column {column!r} is {arr.type}, not a string")
        try:  # Parquet does not promise valid UTF-8 in a string column; Arrow checks it only here
            return batch_from_lists(options.tokenizer.encode_batch(arr.to_pylist()))
        except UnicodeError as exc:
            raise InputFormatError(f"{path}: text column {column!r} is not valid UTF-8 ({exc})") from exc
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not pa.types.is_integer(
        arr.type.value_type
    ):
        raise InputFormatError(f"{path}: column {column!r} is {arr.type}, expected a list of integer token ids")
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values
    if values.null_count:
        raise InputFormatError(f"{path}: column {column!r} has null token ids")
    flat = values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return DocBatch(flat, offsets - offsets[0])
