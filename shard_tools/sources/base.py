"""Shared types of the input readers."""

from __future__ import annotations

import lzma
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import zstandard

from ..format.policy import MediaPolicy
from .tokenizer import TextTokenizer

__all__ = ["DocBatch", "SourceOptions", "Unit", "batch_from_lists", "READ_ERRORS"]

# What reading a (possibly compressed) input can raise on a truncated or corrupt file; the
# readers map these to InputFormatError naming the file.
READ_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)


class DocBatch(NamedTuple):
    """Documents as one flat integer array plus ``len(docs) + 1`` int64 offsets.

    ``rows``, when a reader knows it, is where each document sits in its input file (JSONL: the
    1-based line); left None, the packer numbers the documents of a file from 0 instead. ``media``, from a
    reader of media inputs, is the documents' ``media`` column (:mod:`ferry.shard_tools.format.media`), and
    ``skipped_media`` how many bad media items it left out (``--skip-bad-media``).
    """

    tokens: np.ndarray
    offsets: np.ndarray
    rows: np.ndarray | None = None
    media: Any = None
    skipped_media: int = 0


@dataclass(frozen=True)
class Unit:
    """One piece of input for one worker: a whole file (``stop`` None), or ``[start, stop)`` of it
    counted in ``span``: ``documents`` (Megatron), ``row_groups`` (Parquet), ``bytes`` (plain
    JSON Lines / text, cut just after a newline) or ``zstd_frames`` (compressed bytes of whole
    zstd frames; the unit owns the lines after each newline in its frames, see :mod:`.split`)."""

    path: str
    format: str
    start: int = 0
    stop: int | None = None
    span: str = "documents"
    first_document: int | None = None  # for row groups: the index in the file of the unit's first row


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """How to read inputs. With a ``tokenizer``, text is read from ``text_column``/``text_field``;
    without one, token ids from ``tokens_column``. ``split`` picks the split of a Hugging Face
    dataset directory."""

    tokenizer: TextTokenizer | None = None
    tokens_column: str = "tokens"
    text_column: str = "text"
    text_per_line: bool = False
    eos_id: int | None = None
    shard_size: int = 128 * 2**20
    token_itemsize: int = 4  # bytes per stored token id (2 for uint16 datasets); planners size units with it
    eos_appended: bool = False  # whether packing adds one EOS token per document
    storage_options: dict[str, Any] | None = None
    batch_documents: int = 4096
    split: str | None = None
    origin: bool = True  # record each document's input file and row in the shards (columns origin_file/origin_row)
    split_size: int | None = None  # size of the sub-units of a large input; None: see split.split_size
    media: MediaPolicy | None = None  # pack media with their placeholder spans under this policy (None: text only)
    media_column: str = "image"  # the image column of Parquet / Hugging Face inputs
    skip_bad_media: bool = False  # leave out (and count) media that fail their checks instead of failing the pack


def batch_from_lists(docs: list[np.ndarray]) -> DocBatch:
    """Concatenate separate document arrays into one :class:`DocBatch`."""
    lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.concatenate([np.asarray(d) for d in docs]) if docs else np.zeros(0, dtype=np.int64)
    return DocBatch(tokens, offsets)
