"""Media in table inputs: Parquet files and Hugging Face datasets with an image column.

The image column (``--media-column``, default ``image``) holds per row one item or a list of them,
each either raw bytes (``binary``) or a Hugging Face ``Image`` feature value (``struct<bytes, path>``,
as ``save_to_disk`` and the Hub's Parquet files store it; only embedded bytes are read, a value with a
path alone is a bad item). A row's document is its images, then its text (``--text-column``, may be absent
or null).
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from ..errors import InputFormatError
from .base import DocBatch, SourceOptions
from .mediaprobe import DocumentBuilder, Segment

__all__ = ["media_batches", "check_media_column"]


def check_media_column(path: str, options: SourceOptions, names: list[str]) -> None:
    """The media column must be there, once."""
    if names.count(options.media_column) != 1:
        found = "twice" if options.media_column in names else "no"
        raise InputFormatError(
            f"{path}: {found} media column {options.media_column!r} (columns: {', '.join(names)}); use --media-column"
        )


def media_batches(
    path: str, batches: Iterator[pa.RecordBatch], options: SourceOptions, first: int = 0
) -> Iterator[DocBatch]:
    """Documents with media from record batches holding the media column and, when present, the text column."""
    builder = DocumentBuilder(options, path)
    row = first
    for batch in batches:
        names = batch.schema.names
        check_media_column(path, options, names)
        media = batch.column(names.index(options.media_column))
        media.validate(full=True)
        texts = batch.column(names.index(options.text_column)).to_pylist() if options.text_column in names else None
        for i, value in enumerate(media.to_pylist()):
            segments = [Segment(data=data, name=f"{options.media_column}[{k}]") for k, data in enumerate(_items(value))]
            text = texts[i] if texts is not None else None
            if text is not None and not isinstance(text, str):
                raise InputFormatError(f"{path}: row {row}: text column {options.text_column!r} is not a string")
            builder.add(segments + ([Segment(text=text)] if text else []), row)
            row += 1
            if builder.full():
                yield builder.flush()
    if builder.docs or builder.skipped:
        yield builder.flush()


def _items(value: object) -> list[bytes]:
    """The encoded bytes of one cell: None, bytes, an ``Image`` struct, or a list of those."""
    if value is None:
        return []
    if isinstance(value, list):
        return [b for v in value for b in _items(v)]
    if isinstance(value, dict):
        data = value.get("bytes")
        return [data if isinstance(data, bytes) else b""]  # a path alone: empty, refused as a bad item
    if isinstance(value, bytes):
        return [value]
    return [b""]
