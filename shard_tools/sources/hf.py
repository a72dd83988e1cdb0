"""Hugging Face datasets as input: ``save_to_disk`` directories and the Hub's Parquet layout.

``Dataset.save_to_disk`` writes ``state.json`` (its Arrow files, in order) and
``dataset_info.json``; ``DatasetDict.save_to_disk`` writes ``dataset_dict.json`` and one such
directory per split. A downloaded Hub dataset repository keeps its Parquet files as
``data/<split>-NNNNN-of-NNNNN.parquet`` (or ``<split>-*.parquet`` in a config's directory).
Planning turns such a directory into its data files in order; the Arrow files (Arrow IPC
streams) are read here with pyarrow and the Parquet files by the Parquet reader, so packing
needs no ``datasets`` package.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import fsspec
import pyarrow as pa
from fsspec.implementations.local import LocalFileSystem

from ..errors import InputFormatError, UsageError
from .base import DocBatch, SourceOptions, Unit
from .mediatable import check_media_column, media_batches
from .parquet import _convert, find_column

__all__ = ["dataset_files", "is_directory", "read_arrow"]

_SPLIT_NAME = re.compile(r"^\w+(\.\w+)*$")  # what `datasets` allows as a split name
# the Hub's shard names: <split>-00000-of-00003.parquet, some with a -<hash> suffix
_NUMBERED = re.compile(r"^[^-]+-(?P<index>\d+)-of-(?P<of>\d+)(-[^/]*)?\.parquet$")
_FILE_MAGIC = b"ARROW1"  # the Arrow IPC *file* format; save_to_disk writes the stream format
_LAYOUTS = "state.json (Dataset.save_to_disk), dataset_dict.json (DatasetDict.save_to_disk) or data/<split>-*.parquet"


def is_directory(path: str, options: SourceOptions) -> bool:
    """Whether ``path`` names a directory (or an object-store prefix)."""
    try:
        fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
        return bool(fs.isdir(root))
    except (ImportError, ValueError, OSError):
        return False


def dataset_files(path: str, options: SourceOptions) -> list[tuple[str, str]]:
    """The data files of the dataset directory ``path`` (of ``options.split``), each with its format."""
    fs, root = _fs(path, options)
    names = _listing(fs, root, path)
    if "dataset_dict.json" in names:
        return _dict_files(fs, root, path, options.split)
    if "state.json" in names:
        if options.split is not None:
            _check_single_split(fs, root, path, options.split)
        return _saved_files(fs, root, path, names)
    data = "data" if "data" in names and fs.isdir(f"{root}/data") else ""
    found = _listing(fs, f"{root}/{data}", path) if data else names
    parquet = sorted(n for n in found if n.endswith(".parquet"))
    if not parquet:
        raise UsageError(f"{path}: not a Hugging Face dataset directory (expected {_LAYOUTS})")
    return _hub_files(_join(path, data) if data else path, parquet, options.split)


def _fs(path: str, options: SourceOptions) -> tuple[Any, str]:
    try:
        fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
    except (ImportError, ValueError) as exc:
        raise UsageError(f"cannot open input {path!r}: {exc}") from exc
    return fs, root.rstrip("/")


def _listing(fs: Any, root: str, path: str) -> set[str]:
    try:
        if not fs.isdir(root):
            raise UsageError(f"{path}: not a directory; a Hugging Face dataset is a directory with {_LAYOUTS}")
        return {str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)}
    except OSError as exc:
        raise InputFormatError(f"{path}: cannot list the dataset directory ({exc})") from exc


def _join(path: str, name: str) -> str:
    return f"{path.rstrip('/')}/{name}"


def _read_json(fs: Any, root: str, path: str, name: str) -> Any:
    """A JSON file of the layout, which must be a regular file: a link to ``/dev/zero`` or a FIFO
    would be read without end."""
    where = _join(path, name)
    try:
        info = fs.info(f"{root}/{name}")
        if info.get("type") != "file":
            raise InputFormatError(f"{where}: not a regular file")
        with fs.open(f"{root}/{name}", "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InputFormatError(f"{where}: not a readable JSON file ({exc})") from exc


def _pick_split(where: str, splits: list[str], split: str | None) -> str:
    if split is None:
        if len(splits) == 1:
            return splits[0]
        raise UsageError(f"{where} has splits {', '.join(splits)}: pass --split NAME")
    if split not in splits:
        raise UsageError(f"{where} has no split {split!r} (splits: {', '.join(splits) or 'none'})")
    return split


def _dict_files(fs: Any, root: str, path: str, split: str | None) -> list[tuple[str, str]]:
    """A ``DatasetDict``: ``dataset_dict.json`` lists the splits, each a saved ``Dataset``."""
    doc = _read_json(fs, root, path, "dataset_dict.json")
    splits = doc.get("splits") if isinstance(doc, dict) else None
    # the names become paths: refuse anything but a plain split name
    if not isinstance(splits, list) or not all(isinstance(s, str) and _SPLIT_NAME.match(s) for s in splits):
        raise InputFormatError(f'{_join(path, "dataset_dict.json")}: expected {{"splits": [NAME, ...]}}')
    name = _pick_split(path, splits, split)
    sub_root, sub_path = f"{root}/{name}", _join(path, name)
    names = _listing(fs, sub_root, sub_path) if fs.isdir(sub_root) else set()
    if "state.json" not in names:
        raise InputFormatError(f"{sub_path}: split {name!r} has no state.json; the DatasetDict is incomplete")
    return _saved_files(fs, sub_root, sub_path, names)


def _check_single_split(fs: Any, root: str, path: str, split: str) -> None:
    recorded = _read_json(fs, root, path, "state.json")
    recorded = recorded.get("_split") if isinstance(recorded, dict) else None
    if recorded != split:
        what = f"split {recorded!r}" if recorded else "no split name"
        raise UsageError(f"{path} is one saved Dataset ({what}), not a DatasetDict: drop --split {split}")


def _saved_files(fs: Any, root: str, path: str, names: set[str]) -> list[tuple[str, str]]:
    """A saved ``Dataset``: the Arrow files ``state.json`` lists, in its order."""
    where = _join(path, "state.json")
    state = _read_json(fs, root, path, "state.json")
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list):  # empty for a dataset of no rows
        raise InputFormatError(f'{where}: expected a "_data_files" list')
    if state.get("_indices_data_files"):  # old `datasets` kept a row selection beside the data
        raise InputFormatError(f"{where}: saved with an indices mapping; call flatten_indices() and save again")
    out = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        # a file name, never a path: state.json must not point outside its directory
        if not isinstance(name, str) or "/" in name or "\\" in name or name in ("", ".", ".."):
            raise InputFormatError(f'{where}: bad entry {entry!r} in "_data_files" (expected {{"filename": NAME}})')
        if name not in names:
            raise InputFormatError(f"{where} lists {name}, which is missing: the saved dataset is incomplete")
        if (_join(path, name), "arrow") in out:  # save_to_disk never does; reading it twice doubles its rows
            raise InputFormatError(f'{where} lists {name} twice in "_data_files"; the file is corrupt')
        out.append((_join(path, name), "arrow"))
    return out


def _hub_files(data_path: str, parquet: list[str], split: str | None) -> list[tuple[str, str]]:
    """The Hub's layout: ``<split>-00000-of-00003.parquet``, …, in name order."""
    by_split: dict[str, list[str]] = {}
    for name in parquet:
        by_split.setdefault(name[: -len(".parquet")].partition("-")[0], []).append(name)
    name = _pick_split(data_path, sorted(by_split), split)
    _check_numbered(data_path, name, by_split[name])
    return [(_join(data_path, n), "parquet") for n in by_split[name]]


def _check_numbered(data_path: str, split: str, names: list[str]) -> None:
    """Files numbered ``-IIIII-of-NNNNN`` must be exactly the N of one count: a download stopped
    half way, or the files of two revisions side by side, is not the split."""
    numbered = {n: m for n in names if (m := _NUMBERED.match(n))}
    if not numbered:
        return
    counts = sorted({int(m["of"]) for m in numbered.values()})
    odd = next((n for n in names if n not in numbered), None)
    if len(counts) > 1 or odd is not None:
        kinds = ", ".join(f"-of-{c:05d}" for c in counts) + (f" and {odd}" if odd else "")
        raise InputFormatError(
            f"{data_path}: split {split!r} mixes files numbered {kinds}; keep the files of one revision only"
        )
    total, seen = counts[0], sorted(int(m["index"]) for m in numbered.values())
    if seen != list(range(total)):
        missing = next((i for i in range(total) if i not in seen), None)
        what = f"{split}-{missing:05d}-of-{total:05d} is missing" if missing is not None else "a number repeats"
        raise InputFormatError(
            f"{data_path}: split {split!r} has {len(seen)} files numbered of {total}: {what}; download the whole split"
        )


def read_arrow(unit: Unit, options: SourceOptions) -> Iterator[DocBatch]:
    """Documents of an Arrow IPC file (stream or file format), e.g. one written by ``save_to_disk``."""
    column = options.text_column if options.tokenizer is not None else options.tokens_column
    try:
        with _open(unit.path, options) as source:
            schema, batches = _ipc_batches(source)
            if options.media is not None:  # images (Image structs or bytes) and their text
                check_media_column(unit.path, options, schema.names)
                yield from media_batches(unit.path, batches, options)
                return
            index = find_column(unit.path, column, schema.names)
            for batch in batches:
                for start in range(0, batch.num_rows, options.batch_documents):
                    arr = _checked(batch.column(index).slice(start, options.batch_documents))
                    yield _convert(unit.path, column, arr, options)
    except (pa.ArrowException, OSError) as exc:
        raise InputFormatError(f"{unit.path}: not a readable Arrow IPC file ({exc})") from exc


def _open(path: str, options: SourceOptions) -> Any:
    """A memory map for local paths (as ``datasets`` reads them), else an fsspec file."""
    fs, root = fsspec.core.url_to_fs(path, **(options.storage_options or {}))
    if isinstance(fs, LocalFileSystem):
        return pa.memory_map(root, "r")
    return fs.open(root, "rb")


def _ipc_batches(source: Any) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    magic = source.read(len(_FILE_MAGIC))
    source.seek(0)
    if magic == _FILE_MAGIC:
        reader = pa.ipc.open_file(source)
        return reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
    stream = pa.ipc.open_stream(source)
    return stream.schema, iter(stream)


def _checked(arr: pa.Array) -> pa.Array:
    """Validate the buffers (IPC reading does not, and a bad offset would read out of bounds);
    fixed-length sequences (``Sequence(length=N)``) become plain lists."""
    arr.validate(full=True)
    if pa.types.is_fixed_size_list(arr.type):
        arr = arr.cast(pa.list_(arr.type.value_type))
    return arr
