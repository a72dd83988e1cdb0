"""Input corpora: detect a file's format, plan it into units of work, read documents from a unit.

A *unit* is the smallest piece of input a pack worker takes: a whole file, or a part of a
large one (a fixed range of Megatron documents, a run of Parquet row groups, a newline-aligned
byte range of JSON Lines / text, a run of zstd frames: see :mod:`.split`). Units depend only on
the inputs, the shard size and the options, never on the number of workers, so the packed
output does not either. Readers yield :class:`DocBatch` es of documents *without* EOS. A Hugging
Face dataset directory is planned as its data files (see :mod:`.hf`).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import fsspec

from ..errors import UsageError
from .base import DocBatch, SourceOptions, Unit
from .hf import dataset_files, is_directory, read_arrow
from .jsonl import read_jsonl
from .megatron import plan_megatron, read_megatron
from .npy import read_npy
from .parquet import read_parquet
from .split import plan_file
from .text import read_text
from .wds import read_wds

__all__ = ["DocBatch", "SourceOptions", "Unit", "FORMATS", "detect_format", "plan_units", "read_unit"]

Reader = Callable[[Unit, SourceOptions], Iterator[DocBatch]]
FORMATS: dict[str, Reader] = {
    "parquet": read_parquet,
    "jsonl": read_jsonl,
    "text": read_text,
    "npy": read_npy,
    "megatron": read_megatron,
    "arrow": read_arrow,
    "wds": read_wds,
}
_SUFFIXES = [
    (".parquet", "parquet"),
    (".jsonl", "jsonl"),
    (".jsonl.gz", "jsonl"),
    (".jsonl.zst", "jsonl"),
    (".json", "jsonl"),
    (".json.gz", "jsonl"),
    (".json.zst", "jsonl"),
    (".txt", "text"),
    (".txt.gz", "text"),
    (".txt.zst", "text"),
    (".md", "text"),
    (".npy", "npy"),
    (".idx", "megatron"),
    (".bin", "megatron"),
    (".arrow", "arrow"),
    (".tar", "wds"),
]


def detect_format(path: str, explicit: str | None = None) -> str:
    """The input format of ``path``: ``explicit`` if given, else by suffix."""
    if explicit is not None:
        if explicit not in FORMATS:
            raise UsageError(f"unknown input format {explicit!r}; choose one of {', '.join(FORMATS)}, hf")
        return explicit
    lower = path.lower()
    for suffix, fmt in sorted(_SUFFIXES, key=lambda s: -len(s[0])):
        if lower.endswith(suffix):
            return fmt
    raise UsageError(
        f"cannot tell the format of {path!r} from its suffix; pass --input-format ({', '.join(FORMATS)}, hf)"
    )


def plan_units(paths: Sequence[str], options: SourceOptions, explicit_format: str | None = None) -> list[Unit]:
    """Units of work for ``paths`` in input order (Megatron prefixes given as .bin and .idx count
    once). A file given twice (``a.jsonl ./a.jsonl``, or a glob and one of its matches) is a
    UsageError: packing it twice would double its documents."""
    units: list[Unit] = []
    seen_prefixes: set[str] = set()
    seen: dict[str, str] = {}
    for path, fmt in _formats(expand_globs(paths, options), options, explicit_format):
        if fmt == "megatron":
            prefix = path[:-4] if path.endswith((".bin", ".idx")) else path
            if _identity(prefix) in seen_prefixes:
                continue
            seen_prefixes.add(_identity(prefix))
            units.extend(plan_megatron(prefix, options))
            continue
        if (earlier := seen.setdefault(_identity(path), path)) is not path:
            raise UsageError(
                f"input {path!r} is given twice (also as {earlier!r}); each input is packed once. "
                "To weight a source, mix datasets when loading (TokenDataset.mix)"
            )
        units.extend(plan_file(path, fmt, _file_size(path, options), options))
    if not units:
        raise UsageError("no input files given")
    return units


def _identity(path: str) -> str:
    """``path`` spelled one way: a local path absolute and normalised (symlinks kept: two names
    may share a target, as the Hub cache's links to identical files do), a URL as given."""
    local = path[len("file://") :] if path.startswith("file://") else path
    return path if "://" in local else os.path.normpath(os.path.abspath(local))


def _formats(paths: Sequence[str], options: SourceOptions, explicit: str | None) -> Iterator[tuple[str, str]]:
    """Each input with its format; a Hugging Face dataset directory (``--input-format hf``, or a
    directory given without a known suffix) stands for its data files."""
    datasets, files = 0, 0
    for path in paths:
        lower = path.lower()
        guess = explicit is None and not any(lower.endswith(s) for s, _ in _SUFFIXES)
        if explicit == "hf" or (guess and is_directory(path, options)):
            datasets += 1
            found = dataset_files(path, options)
            files += len(found)
            yield from found
        else:
            files += 1
            yield path, detect_format(path, explicit)
    if options.split is not None and not datasets:
        raise UsageError(
            f"--split {options.split} selects a split of a Hugging Face dataset directory; no input is one"
        )
    if datasets and not files:
        raise UsageError("the Hugging Face dataset given has no rows (no data files): nothing to pack")


def expand_globs(paths: Sequence[str], options: SourceOptions) -> list[str]:
    """Expand ``*``, ``?`` and ``[..]`` patterns (for URLs a shell cannot glob), sorted per pattern."""
    out: list[str] = []
    for path in paths:
        if not any(c in path for c in "*?["):
            out.append(path)
            continue
        fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
        matches = sorted(fs.glob(root))
        if _exists(fs, root):  # a file named like a pattern: 'd[1].jsonl' must not quietly mean d1.jsonl
            _check_not_also_a_pattern(path, root, matches)
            out.append(path)
            continue
        if not matches:
            raise UsageError(f"input pattern {path!r} matches no files")
        protocol = path.split("://", 1)[0] + "://" if "://" in path else ""
        out.extend(m if not protocol or m.startswith(protocol) else protocol + m for m in matches)
    return out


def _exists(fs: Any, root: str) -> bool:
    try:
        return bool(fs.exists(root))
    except Exception:  # noqa: BLE001 - as in _file_size: a failure to stat means "not there"
        return False


def _check_not_also_a_pattern(path: str, root: str, matches: Sequence[str]) -> None:
    others = [m for m in matches if m.rstrip("/") != root.rstrip("/")]
    if others:
        more = f" and {len(others) - 1} more" if len(others) > 1 else ""
        raise UsageError(
            f"input {path!r} names a file and is also a pattern matching {others[0]}{more}; to pack the "
            f"file, bracket its pattern characters ({glob.escape(path)!r}), or rename it"
        )


def _file_size(path: str, options: SourceOptions) -> int:
    try:
        fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
    except (ImportError, ValueError, OSError) as exc:
        raise UsageError(f"cannot open input {path!r}: {exc}") from exc
    try:
        info = fs.info(root)
    except Exception:  # noqa: BLE001 - as fs.isfile: any failure to stat means "not a file"
        info = {}
    if info.get("type") != "file":
        raise UsageError(f"input {path!r} does not exist or is not a file")
    return int(info.get("size") or 0)


def read_unit(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    return FORMATS[unit.format](unit, options)
