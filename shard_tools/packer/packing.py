"""``ferry pack``: corpora in, immutable checksummed shards plus a published manifest out.

Plan (pure): inputs → units. Do: each unit is read, cut into shards at document
boundaries once the raw size reaches ``shard_size``, encoded, compressed and stored under
its content digest (:mod:`.packunit`) — by an executor (in-process, a process pool, Ray,
or one ``--part I/N`` of a fan-out), results gathered in unit order. Publish: shard
table, ``versions/<id>.json``, ``manifest.json`` last. Since units and cuts never depend
on the executor, every way of running gives byte-identical shards and the same version id.
"""

from __future__ import annotations

import datetime as _dt
import os
import sys
import time
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .. import __version__
from ..dataset import load_manifest
from ..errors import DatasetNotFoundError, InputFormatError, UsageError
from ..format.manifest import Manifest, ShardInfo, ShardTable, Tokenizer
from ..format.policy import MediaPolicy, parse_policy
from ..format.seekable import DEFAULT_FRAME_SIZE, MAX_FRAME_SIZE, MIN_FRAME_SIZE
from ..format.shard import STORED_FORMATS, dtype_for_vocab
from ..sources import DocBatch, SourceOptions, Unit, plan_units
from ..sources.base import batch_from_lists
from ..sources.tokenizer import load_tokenizer
from ..storage.publish import publish_version
from ..storage.store import Location, resolve
from ..units import parse_size
from .executors import EXECUTORS, run_units
from .packunit import Job, UnitResult, pack_batches
from .parts import DatasetHeader, PartRecord, parse_part_spec, read_parts, run_id_for, write_part

__all__ = [
    "PackOptions",
    "PackResult",
    "PartResult",
    "pack",
    "pack_part",
    "merge_parts",
    "pack_documents",
    "parse_size",
    "parse_part_spec",
]

DEFAULT_SHARD_SIZE = 128 * 2**20
DEFAULT_LEVEL = 1  # on token streams, about level 3's ratio at a fraction of its time
# Seekable frames by default: a seekable format may be the default only where it costs at most 3% ratio and 5%
# pack throughput against format 1 at the same level; the bench suite "seek" measures it (the README gives the
# numbers). Format 3 stores what format 2 does plus 16 bytes of raw digest per frame, and takes the place of
# its flat raw digest with the tree-shaped one (the README gives its pack cost). `--format 2` packs what
# ferry before 3 reads, `--format 1` one zstd frame (what ferry before 2 reads).
DEFAULT_STORED_FORMAT = 3


@dataclass(frozen=True, kw_only=True)
class PackOptions:
    """Everything ``ferry pack`` takes besides inputs and output."""

    name: str | None = None
    tokenizer: str | None = None  # "bytes", tokenizer.json, model dir or "tiktoken:PATH"; None for token ids
    eos_token: str | None = None
    vocab_size: int | None = None  # required for token-id input
    eos_id: int | None = None
    append_eos: bool = True
    input_format: str | None = None
    split: str | None = None  # the split of a Hugging Face dataset directory (--split)
    origin: bool = True  # record each document's input file and row/line in the shards (--no-origin: not)
    tokens_column: str = "tokens"
    text_column: str = "text"
    text_per_line: bool = False
    shard_size: int = DEFAULT_SHARD_SIZE
    compression_level: int = DEFAULT_LEVEL
    stored_format: int = DEFAULT_STORED_FORMAT  # --format: 1 one zstd frame, 2 and 3 seekable frames (seekable.py)
    frame_size: int = DEFAULT_FRAME_SIZE  # raw bytes per frame in formats 2 and 3
    workers: int = 1
    executor: str = "local"  # "local" (in-process / process pool) or "ray"
    ray_address: str | None = None
    append: bool = False
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    input_storage_options: Mapping[str, Any] = field(default_factory=dict)
    progress: bool | None = None  # None: only on a TTY
    media_policy: str | None = None  # --media-policy: pack media (images, audio) with placeholder spans under it
    media_column: str = "image"  # --media-column: the image column of Parquet / Hugging Face inputs
    skip_bad_media: bool = False  # --skip-bad-media: leave out and count bad media instead of failing

    def __post_init__(self) -> None:
        if self.name is not None:
            _check_name(self.name)
        if self.shard_size < 1024:
            raise UsageError(f"--shard-size {self.shard_size} is too small (at least 1 KiB)")
        if not 1 <= self.compression_level <= 22:
            raise UsageError(f"zstd level {self.compression_level} is outside 1..22")
        if self.stored_format not in STORED_FORMATS:
            raise UsageError(
                f"--format {self.stored_format}: choose 3 (seekable frames, the default), 2 (seekable frames, "
                "read by ferry before 3) or 1 (one zstd frame)"
            )
        if not MIN_FRAME_SIZE <= self.frame_size <= MAX_FRAME_SIZE:
            raise UsageError(f"frame size {self.frame_size} is outside {MIN_FRAME_SIZE}..{MAX_FRAME_SIZE} bytes")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")
        if self.executor not in EXECUTORS:
            raise UsageError(f"--executor {self.executor!r}: choose one of {', '.join(EXECUTORS)}")
        if self.vocab_size is not None and self.vocab_size <= 0:
            raise UsageError(f"--vocab-size must be positive, got {self.vocab_size}")
        if self.eos_id is not None and self.eos_id < 0:
            raise UsageError(f"--eos-id must not be negative, got {self.eos_id}")


# Controls (C0, DEL, C1), format characters (bidi overrides, zero-width) and line/paragraph separators: a
# name with one would rewrite a terminal or forge a line wherever a dataset's name is shown or logged.
_NAME_CONTROLS = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def _check_name(name: str) -> None:
    """A UsageError naming the character by its escape when ``name`` holds a control character."""
    bad = next((ch for ch in name if unicodedata.category(ch) in _NAME_CONTROLS), None)
    if bad is not None:
        raise UsageError(
            f"--name {name!r} holds the control character {bad!r} (at position {name.index(bad)}); "
            "a dataset name may not hold control characters"
        )


@dataclass(frozen=True)
class PackResult:
    """What a pack produced (``--json`` prints this)."""

    url: str
    version_id: str
    parent: str | None
    shards: int
    new_shards: int
    documents: int
    tokens: int
    stored_bytes: int
    raw_bytes: int
    seconds: float
    media_items: int = 0
    media_bytes: int = 0
    skipped_media: int = 0  # bad media items this pack left out (--skip-bad-media)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tokens_per_second": self.tokens_per_second}


@dataclass(frozen=True)
class PartResult:
    """What one ``--part I/N`` run stored (its shards are published later by ``--merge``)."""

    url: str
    run_id: str
    part: int
    parts: int
    record: str
    units: int
    shards: int
    documents: int
    tokens: int
    seconds: float
    skipped_media: int = 0  # bad media items this part left out (--skip-bad-media)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Prepared:
    """A planned pack: dataset header, units and the worker job (no I/O has happened yet)."""

    header: DatasetHeader
    units: list[Unit]
    job: Job


def _resolve_tokenizer(opts: PackOptions) -> tuple[Tokenizer, Any, MediaPolicy | None]:
    """The tokenizer record, the text tokenizer (None for token-id input) and the media policy."""
    tok = None
    if opts.tokenizer is not None:
        tok = load_tokenizer(opts.tokenizer, opts.eos_token)
        eos = opts.eos_id if opts.eos_id is not None else tok.info.eos_id
        info = Tokenizer(tok.info.name, opts.vocab_size or tok.info.vocab_size, eos)
    elif opts.vocab_size is None:
        raise UsageError("token-id input needs --vocab-size (or pass --tokenizer for text input)")
    else:
        info = Tokenizer("none", opts.vocab_size, opts.eos_id)
    if opts.media_policy is None:
        return info, tok, None
    # the placeholder ids: above the tokenizer's vocabulary unless given, which grows to hold them
    media = parse_policy(opts.media_policy).with_ids(info.vocab_size)
    return Tokenizer(info.name, max(info.vocab_size, max(media.ids) + 1), info.eos_id), tok, media


def _header(opts: PackOptions, info: Tokenizer, out_url: str, media: MediaPolicy | None = None) -> DatasetHeader:
    if opts.append_eos and info.eos_id is None:
        raise UsageError("appending EOS needs an EOS id: pass --eos-id (or --no-eos)")
    if info.eos_id is not None and info.eos_id >= info.vocab_size:
        raise UsageError(f"EOS id {info.eos_id} is not below the vocabulary size {info.vocab_size}")
    name = opts.name or out_url.rstrip("/").rsplit("/", 1)[-1]
    return DatasetHeader(name, dtype_for_vocab(info.vocab_size), info, opts.append_eos, media)


def _job(out_url: str, opts: PackOptions, header: DatasetHeader, source: SourceOptions) -> Job:
    return Job(
        out_url=out_url,
        storage_options=dict(opts.storage_options),
        source=source,
        dtype=header.token_dtype,
        vocab_size=header.tokenizer.vocab_size,
        eos_id=header.tokenizer.eos_id if header.eos_appended else None,
        level=opts.compression_level,
        stored_format=opts.stored_format,
        frame_size=opts.frame_size,
    )


def _prepare(inputs: Sequence[str], out_url: str, opts: PackOptions) -> _Prepared:
    info, tok, media = _resolve_tokenizer(opts)
    header = _header(opts, info, out_url, media)
    source = SourceOptions(
        tokenizer=tok,
        tokens_column=opts.tokens_column,
        text_column=opts.text_column,
        text_per_line=opts.text_per_line,
        eos_id=info.eos_id,
        shard_size=opts.shard_size,
        token_itemsize=np.dtype(header.token_dtype).itemsize,
        eos_appended=header.eos_appended,
        storage_options=dict(opts.input_storage_options) or None,
        split=opts.split,
        origin=opts.origin,
        media=media,
        media_column=opts.media_column,
        skip_bad_media=opts.skip_bad_media,
    )
    units = plan_units(list(inputs), source, opts.input_format)
    return _Prepared(header, units, _job(out_url, opts, header, source))


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _progress(total: int, enabled: bool | None) -> Any:
    from tqdm import tqdm

    show = sys.stderr.isatty() if enabled is None else enabled
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
        cols, rows = size.columns or 100, size.lines or 24  # a fresh pty reports 0x0; tqdm then hides the bar
    except (OSError, ValueError):
        cols, rows = 100, 24
    return tqdm(total=total, unit="unit", disable=not show, ncols=cols, nrows=rows, desc="packing", file=sys.stderr)


def _collect(results: Iterable[UnitResult], total_units: int, progress: bool | None) -> list[UnitResult]:
    """Gather unit results in order, driving the progress bar (documents, tokens, MB/s)."""
    started = time.perf_counter()
    out: list[UnitResult] = []
    docs = tokens = stored = 0
    bar = _progress(total_units, progress)
    try:
        for result in results:
            out.append(result)
            docs += result.documents
            tokens += result.tokens
            stored += sum(s.stored_bytes for s in result.shards)
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix(
                docs=f"{docs:,}",
                tokens=f"{tokens / 1e6:.1f}M",
                tok_s=f"{tokens / elapsed / 1e6:.1f}M",
                MB_s=f"{stored / elapsed / 1e6:.1f}",
                refresh=False,
            )
            bar.update(1)
    finally:
        bar.close()
    return out


def _previous(out: Location, append: bool) -> Manifest | None:
    """The current version to build on (``--append``), refusing to overwrite a dataset otherwise."""
    if not append:
        if out.exists("manifest.json"):
            raise UsageError(f"{out.url} already holds a dataset; pass --append to add a version to it")
        return None
    try:
        return load_manifest(out)
    except DatasetNotFoundError:
        return None


def _check_compatible(prev: Manifest, header: DatasetHeader, explicit_name: bool) -> None:
    if explicit_name and prev.name != header.name:
        raise UsageError(f"cannot append: --name {header.name!r} differs from the dataset's name {prev.name!r}")
    mismatches = []
    if prev.token_dtype != header.token_dtype:
        mismatches.append(f"token dtype {prev.token_dtype} vs {header.token_dtype}")
    if prev.tokenizer != header.tokenizer:
        mismatches.append(f"tokenizer {prev.tokenizer.to_dict()} vs {header.tokenizer.to_dict()}")
    if prev.eos_appended != header.eos_appended:
        mismatches.append(f"eos_appended {prev.eos_appended} vs {header.eos_appended}")
    if prev.media != header.media:
        mismatches.append(f"media policy {prev.media} vs {header.media}")
    if mismatches:
        raise UsageError(
            f"cannot append to {prev.name!r}: the dataset and this pack differ in " + "; ".join(mismatches)
        )


def _publish(
    out: Location,
    previous: Manifest | None,
    header: DatasetHeader,
    rows: list[ShardInfo],
    started: float,
    *,
    explicit_name: bool = False,
    skipped_media: int = 0,
) -> PackResult:
    new_table = ShardTable.from_rows(rows, media=header.media is not None)

    def build(base: Manifest | None) -> tuple[Manifest, bytes]:
        return Manifest.build(
            name=base.name if base is not None else header.name,
            token_dtype=header.token_dtype,
            tokenizer=header.tokenizer,
            eos_appended=header.eos_appended,
            shards=base.shards.concat(new_table) if base is not None else new_table,
            parent=base.version_id if base else None,
            created_at=_now(),
            tool_version=__version__,
            lineage=base.child_lineage() if base else None,
            media=header.media,
        )

    def rebase(current: str) -> tuple[Manifest, bytes]:
        # another --append won the race: add our shards on top of its version instead
        base = load_manifest(out, current)
        _check_compatible(base, header, explicit_name)
        return build(base)

    manifest, table_data = build(previous)
    manifest = publish_version(
        out,
        manifest,
        table_data,
        expect_current=previous.version_id if previous else None,
        new_shards=[r.path for r in rows],
        rebase=rebase if previous is not None else None,
    )
    totals = manifest.totals
    return PackResult(
        url=out.url,
        version_id=manifest.version_id,
        parent=manifest.parent,
        shards=totals["shards"],
        new_shards=len(rows),
        documents=totals["documents"],
        tokens=totals["tokens"],
        stored_bytes=totals["stored_bytes"],
        raw_bytes=totals["raw_bytes"],
        seconds=time.perf_counter() - started,
        media_items=totals.get("media_items", 0),
        media_bytes=totals.get("media_bytes", 0),
        skipped_media=skipped_media,
    )


def _shared_across_processes(loc: Location) -> bool:
    """False for ``memory://``: worker processes would each write to their own memory."""
    protocols = loc.fs.protocol if isinstance(loc.fs.protocol, tuple) else (loc.fs.protocol,)
    return "memory" not in protocols


def pack(inputs: Sequence[str], out: str, options: PackOptions | None = None) -> PackResult:
    """Pack corpus files into a dataset at ``out`` (any fsspec URL) and publish a version.

    Nothing is published unless every unit was packed: on any error the dataset at ``out``
    (if any) keeps its current version; stored shards are immutable and named by content,
    so leftovers are harmless and a re-run reuses them.
    """
    started = time.perf_counter()
    opts = options or PackOptions()
    prep = _prepare(inputs, out, opts)
    loc = resolve(out, opts.storage_options)
    previous = _previous(loc, opts.append)
    if previous is not None:
        _check_compatible(previous, prep.header, opts.name is not None)
    workers = opts.workers if _shared_across_processes(loc) else 1
    results = _collect(
        run_units(prep.job, prep.units, opts.executor, workers=workers, ray_address=opts.ray_address),
        len(prep.units),
        opts.progress,
    )
    rows = [row for r in results for row in r.shards]
    skipped = sum(r.skipped_media for r in results)
    return _publish(
        loc, previous, prep.header, rows, started, explicit_name=opts.name is not None, skipped_media=skipped
    )


def pack_part(
    inputs: Sequence[str],
    out: str,
    part: int,
    parts: int,
    options: PackOptions | None = None,
    run_id: str | None = None,
) -> PartResult:
    """Pack units ``i`` with ``i % parts == part`` and store their rows as a part record.

    Run the same command with every ``part`` in ``0..parts-1`` (e.g. one per node of a Slurm
    array), then :func:`merge_parts` publishes one version, identical to a local pack.
    """
    started = time.perf_counter()
    opts = options or PackOptions()
    if not 0 <= part < parts:
        raise UsageError(f"--part {part}/{parts}: expected 0 <= I < N")
    prep = _prepare(inputs, out, opts)
    rid = run_id or run_id_for(prep.units, prep.header, prep.job, parts)
    mine = [i for i in range(len(prep.units)) if i % parts == part]
    loc = resolve(out, opts.storage_options)
    results = _collect(
        run_units(
            prep.job,
            [prep.units[i] for i in mine],
            opts.executor,
            workers=opts.workers if _shared_across_processes(loc) else 1,
            ray_address=opts.ray_address,
        ),
        len(mine),
        opts.progress,
    )
    record = PartRecord(
        run_id=rid,
        part=part,
        parts=parts,
        units=len(prep.units),
        header=prep.header,
        results={i: r.shards for i, r in zip(mine, results, strict=True)},
        skipped_media={i: r.skipped_media for i, r in zip(mine, results, strict=True) if r.skipped_media},
    )
    path = write_part(loc, record)
    return PartResult(
        url=loc.url,
        run_id=rid,
        part=part,
        parts=parts,
        record=path,
        units=len(mine),
        shards=sum(len(r.shards) for r in results),
        documents=sum(r.documents for r in results),
        tokens=sum(r.tokens for r in results),
        seconds=time.perf_counter() - started,
        skipped_media=sum(r.skipped_media for r in results),
    )


def merge_parts(
    out: str,
    options: PackOptions | None = None,
    *,
    run_id: str | None = None,
    inputs: Sequence[str] | None = None,
    parts: int | None = None,
) -> PackResult:
    """Publish one version from the part records of a ``--part I/N`` run.

    The run is ``run_id``, else the one computed from ``inputs`` and ``options`` (with
    ``parts``), else the only run stored under ``parts/``. Every part must be present and
    agree; otherwise nothing is published.
    """
    started = time.perf_counter()
    opts = options or PackOptions()
    loc = resolve(out, opts.storage_options)
    if run_id is None and inputs:
        if parts is None:
            raise UsageError("--merge with inputs needs --parts N (or pass --run-id)")
        prep = _prepare(inputs, out, opts)
        run_id = run_id_for(prep.units, prep.header, prep.job, parts)
    header, rows, skipped = read_parts(loc, run_id)
    previous = _previous(loc, opts.append)
    if previous is not None:
        _check_compatible(previous, header, False)
    return _publish(loc, previous, header, rows, started, skipped_media=skipped)


def _doc_tokens(doc: Sequence[int] | np.ndarray, i: int) -> np.ndarray:
    """Document ``i``'s token ids as int64, or InputFormatError: a float, string or other non-integer id is
    refused, never truncated to an integer."""
    try:
        arr = np.asarray(doc)
    except (ValueError, OverflowError) as exc:
        raise InputFormatError(f"document {i}: not a flat sequence of token ids ({exc})") from None
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise InputFormatError(
            f"document {i}: token ids must be a flat sequence of integers, got {arr.ndim}-d {arr.dtype} values"
        )
    if arr.dtype == np.uint64 and arr.max() > np.iinfo(np.int64).max:
        raise InputFormatError(f"document {i}: token id {int(arr.max())} is out of range")
    return arr.astype(np.int64, copy=False)


def pack_documents(
    documents: Iterable[Sequence[int] | np.ndarray], out: str, options: PackOptions | None = None
) -> PackResult:
    """Pack in-memory documents (lists or arrays of token ids) — for tests, notebooks and tools."""
    started = time.perf_counter()
    opts = options or PackOptions()
    info, _, media = _resolve_tokenizer(opts)
    header = _header(opts, info, out, media)
    source = SourceOptions(eos_id=info.eos_id, shard_size=opts.shard_size)
    job = _job(out, opts, header, source)
    loc = resolve(out, opts.storage_options)
    previous = _previous(loc, opts.append)
    if previous is not None:
        _check_compatible(previous, header, opts.name is not None)

    def batches() -> Iterator[DocBatch]:
        chunk: list[np.ndarray] = []
        for i, doc in enumerate(documents):
            chunk.append(_doc_tokens(doc, i))
            if len(chunk) >= 4096:
                yield batch_from_lists(chunk)
                chunk = []
        if chunk:
            yield batch_from_lists(chunk)

    result = pack_batches(job, batches(), "documents")
    return _publish(loc, previous, header, result.shards, started, explicit_name=opts.name is not None)
