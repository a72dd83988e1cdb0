"""JSON Lines input (plain, .gz, .zst; whole files or the parts :mod:`.split` cuts): a token-id
list field, or a text field with a tokenizer."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator

import numpy as np

from ..errors import InputFormatError, TokenRangeError
from .base import READ_ERRORS, DocBatch, SourceOptions, Unit, batch_from_lists
from .ranges import Readable, lines_before, open_unit

__all__ = ["read_jsonl"]

_CHUNK = 1 << 20
# a \u escape of a UTF-16 surrogate: "\ud800" is valid JSON but, unpaired, no text (tokenizers
# fail on it, or silently replace it with U+FFFD)
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte-order mark, as Windows tools write at the start of a file
_At = Callable[[int], str]  # names a line of the unit in errors
_COUNT_ERRORS: tuple[type[BaseException], ...] = (*READ_ERRORS, InputFormatError)


def read_jsonl(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    field = options.text_column if options.tokenizer is not None else options.tokens_column
    at = _LineNames(unit, options)
    pending: list = []
    lines: list[int] = []  # the line of each pending document, for errors found when tokenizing
    try:
        with open_unit(unit, options) as f:
            for lineno, raw in enumerate(_lines(f), 1):
                if lineno == 1 and unit.start == 0:  # the file's first line (see text._open_text)
                    raw = raw.removeprefix(_BOM)
                if not raw.strip():
                    continue
                pending.append(_parse(at, lineno, field, raw, options))
                lines.append(lineno)
                if len(pending) >= options.batch_documents:
                    yield _flush(at, pending, lines, options)
                    pending, lines = [], []
    except READ_ERRORS as exc:
        raise InputFormatError(f"{unit.path}: cannot read as JSON Lines ({exc})") from exc
    if pending:
        yield _flush(at, pending, lines, options)


class _LineNames:
    """``path:LINE`` for line ``n`` of a unit, numbered in the whole file: the lines before a
    split unit are counted only when an error needs them."""

    def __init__(self, unit: Unit, options: SourceOptions) -> None:
        self._unit, self._options = unit, options
        self._before: int | None = None

    def before(self) -> int:
        """Lines of the file before the unit's first line (read once, when first needed)."""
        if self._before is None:
            self._before = lines_before(self._unit, self._options)
        return self._before

    def __call__(self, lineno: int) -> str:
        try:
            before = self.before()
        except _COUNT_ERRORS:
            return f"{self._unit.path}, line {lineno} of the part from byte {self._unit.start}"
        return f"{self._unit.path}:{before + lineno}"


def _lines(f: Readable) -> Iterator[bytes]:
    """Split on ``\\n`` in bytes, so a bad UTF-8 sequence is reported with its line (and because
    the zstd reader cannot iterate lines itself)."""
    head: list[bytes] = []  # the start of a line that spans chunks
    while block := f.read(_CHUNK):
        parts = block.split(b"\n")
        if len(parts) == 1:
            head.append(block)
            continue
        head.append(parts[0])
        yield b"".join(head)
        yield from parts[1:-1]
        head = [parts[-1]]
    if rest := b"".join(head):
        yield rest


def _parse(at: _At, lineno: int, field: str, raw: bytes, options: SourceOptions) -> object:
    try:
        text = raw.decode("utf-8")
        record = json.loads(text)
        if raw.count(_spelled(field)) > 1:  # rare: look closer
            _check_one_key(at, lineno, field, text)
    except UnicodeDecodeError as exc:
        raise InputFormatError(f"{at(lineno)}: not valid UTF-8 ({exc})") from exc
    except RecursionError as exc:
        raise InputFormatError(f"{at(lineno)}: JSON nested too deeply to parse") from exc
    except ValueError as exc:  # JSONDecodeError, or an integer literal too long to convert
        raise InputFormatError(f"{at(lineno)}: not valid JSON ({exc})") from exc
    if not isinstance(record, dict) or field not in record:
        found = f"keys {', '.join(map(repr, list(record)[:8]))}" if isinstance(record, dict) else _json_type(record)
        raise InputFormatError(f"{at(lineno)}: expected a JSON object with field {field!r}, found {found}")
    value = record[field]
    if options.tokenizer is not None and isinstance(value, str) and _SURROGATE.search(raw):
        try:  # only JSON's \u escapes can spell a lone surrogate: raw UTF-8 cannot
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InputFormatError(f"{at(lineno)}: field {field!r} is not valid Unicode text ({exc})") from exc
    return _check(at, lineno, field, value, options)


@functools.lru_cache(maxsize=16)
def _spelled(field: str) -> bytes:
    """``field`` as a JSON key is written (without escapes)."""
    return json.dumps(field, ensure_ascii=False).encode()


def _check_one_key(at: _At, lineno: int, field: str, text: str) -> None:
    """``{"tokens": [1], "tokens": [2]}`` is valid JSON, and ``json`` keeps the last value
    unsaid: a record naming the field twice is refused rather than read either way."""
    pairs = json.loads(text, object_pairs_hook=lambda kv: kv)
    if isinstance(pairs, list) and sum(1 for item in pairs if isinstance(item, tuple) and item[0] == field) > 1:
        raise InputFormatError(f"{at(lineno)}: field {field!r} appears more than once in the record")


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _check(at: _At, lineno: int, field: str, value: object, options: SourceOptions) -> object:
    if options.tokenizer is not None:
        if not isinstance(value, str):
            raise InputFormatError(f"{at(lineno)}: field {field!r} is not a string")
        return value
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InputFormatError(f"{at(lineno)}: field {field!r} is not a list of integer token ids")
    try:
        return np.asarray(value, dtype=np.int64)
    except OverflowError:
        bad = next(v for v in value if not -(2**63) <= v < 2**63)
        raise TokenRangeError(
            f"{at(lineno)}: token id {bad} in field {field!r} does not fit in 64 bits, so is in no vocabulary"
        ) from None


def _flush(at: _LineNames, pending: list, lines: list[int], options: SourceOptions) -> DocBatch:
    # provenance: each document's line in the whole file (a split part counts the lines before it once)
    rows = np.asarray(lines, dtype=np.int64) + at.before() if options.origin else None
    if options.tokenizer is None:
        return batch_from_lists(pending)._replace(rows=rows)
    return batch_from_lists(options.tokenizer.encode_batch(pending))._replace(rows=rows)
