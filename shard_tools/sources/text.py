"""Plain text input: one document per file, or one per line (``text_per_line``; large files are
read in the parts :mod:`.split` cuts)."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import fsspec
import numpy as np

from ..errors import InputFormatError, UsageError
from .base import READ_ERRORS, DocBatch, SourceOptions, Unit, batch_from_lists
from .ranges import is_part, lines_before, open_part

__all__ = ["read_text"]

_ERRORS: tuple[type[BaseException], ...] = (*READ_ERRORS, UnicodeDecodeError)


def read_text(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    tokenizer = options.tokenizer
    if tokenizer is None:
        raise UsageError(f"{unit.path}: text input needs a tokenizer (--tokenizer bytes or a tokenizer.json)")
    try:
        with _open_text(unit, options) as f:
            if not options.text_per_line:
                yield batch_from_lists(tokenizer.encode_batch([f.read()]))
                return
            # provenance: lines in the whole file, counted as the text reader below splits them
            before = lines_before(unit, options, universal=True) if options.origin else 0
            pending: list[str] = []
            lines: list[int] = []
            for lineno, line in enumerate(f, before + 1):
                line = line.rstrip("\r\n")
                if not line:
                    continue
                pending.append(line)
                lines.append(lineno)
                if len(pending) >= options.batch_documents:
                    yield _batch(tokenizer.encode_batch(pending), lines, options)
                    pending, lines = [], []
            if pending:
                yield _batch(tokenizer.encode_batch(pending), lines, options)
    except _ERRORS as exc:
        raise InputFormatError(f"{unit.path}: cannot read as UTF-8 text ({exc})") from exc


def _batch(encoded: list, lines: list[int], options: SourceOptions) -> DocBatch:
    batch = batch_from_lists(encoded)
    return batch._replace(rows=np.asarray(lines, dtype=np.int64)) if options.origin else batch


@contextmanager
def _open_text(unit: Unit, options: SourceOptions) -> Iterator[IO[str]]:
    """The unit as text with universal newlines, as ``open(..., "rt")`` reads a whole file. A UTF-8
    byte-order mark at the start of the file marks the encoding and is no part of the text; the
    same character anywhere else is text."""
    if not is_part(unit):
        storage = options.storage_options or {}
        with fsspec.open(unit.path, "rt", compression="infer", encoding="utf-8-sig", **storage) as f:
            yield f
        return
    encoding = "utf-8-sig" if unit.start == 0 else "utf-8"
    with open_part(unit, options) as raw:  # a part starts and ends at a \n, so lines split the same
        yield io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding)
