"""``ferry pack``: corpora in, immutable checksummed shards plus a published manifest out.

Plan (pure): inputs → units. Do: each unit is read, cut into shards at document
boundaries once the raw size reaches ``shard_size``, encoded, compressed and stored under
its content digest — in a process pool, results gathered in unit order. Publish: shard
table, ``versions/<id>.json``, ``manifest.json`` last. Since units and cuts never depend
on the pool, any ``workers`` gives byte-identical shards and the same version id.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as _dt
import multiprocessing
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import __version__
from .dataset import load_manifest
from .digest import digest_bytes
from .errors import DatasetNotFoundError, TokenRangeError, UsageError
from .format import SHARD_SUFFIX, compress, dtype_for_vocab, encode_shard
from .manifest import SHARDS_DIR, Manifest, ShardInfo, ShardTable, Tokenizer
from .publish import publish_version
from .sources import DocBatch, SourceOptions, Unit, plan_units, read_unit
from .store import resolve
from .tokenizer import load_tokenizer

__all__ = ["PackOptions", "PackResult", "pack", "pack_documents", "parse_size"]

DEFAULT_SHARD_SIZE = 128 * 2**20
DEFAULT_LEVEL = 1  # same ratio as level 3 on token streams at ~7x the speed (shared/FINDINGS.md)


def parse_size(text: str | int) -> int:
    """``"128MiB"``, ``"1GB"``, ``"4096"`` → bytes."""
    if isinstance(text, int):
        return text
    units = {
        "": 1,
        "b": 1,
        "k": 10**3,
        "kb": 10**3,
        "kib": 2**10,
        "m": 10**6,
        "mb": 10**6,
        "mib": 2**20,
        "g": 10**9,
        "gb": 10**9,
        "gib": 2**30,
        "t": 10**12,
        "tb": 10**12,
        "tib": 2**40,
    }
    s = text.strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num) :]
    try:
        value = float(num)
    except ValueError:
        raise UsageError(f"cannot read size {text!r} (examples: 128MiB, 1GB, 4096)") from None
    if unit not in units or value <= 0:
        raise UsageError(f"cannot read size {text!r} (examples: 128MiB, 1GB, 4096)")
    return int(value * units[unit])


@dataclass(frozen=True, kw_only=True)
class PackOptions:
    """Everything ``ferry pack`` takes besides inputs and output."""

    name: str | None = None
    tokenizer: str | None = None  # "bytes" or a tokenizer.json path; None for token-id input
    eos_token: str | None = None
    vocab_size: int | None = None  # required for token-id input
    eos_id: int | None = None
    append_eos: bool = True
    input_format: str | None = None
    tokens_column: str = "tokens"
    text_column: str = "text"
    text_per_line: bool = False
    shard_size: int = DEFAULT_SHARD_SIZE
    compression_level: int = DEFAULT_LEVEL
    workers: int = 1
    append: bool = False
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    input_storage_options: Mapping[str, Any] = field(default_factory=dict)
    progress: bool | None = None  # None: only on a TTY

    def __post_init__(self) -> None:
        if self.shard_size < 1024:
            raise UsageError(f"--shard-size {self.shard_size} is too small (at least 1 KiB)")
        if not 1 <= self.compression_level <= 22:
            raise UsageError(f"zstd level {self.compression_level} is outside 1..22")
        if self.workers < 1:
            raise UsageError("--workers must be at least 1")


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

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "tokens_per_second": self.tokens_per_second}


@dataclass(frozen=True)
class _Job:
    """What one worker needs: picklable, no open handles."""

    out_url: str
    storage_options: dict[str, Any]
    source: SourceOptions
    dtype: str
    vocab_size: int
    eos_id: int | None
    level: int


@dataclass(frozen=True)
class _UnitResult:
    shards: list[ShardInfo]
    documents: int
    tokens: int


def _cut_shards(batches: Iterable[DocBatch], budget: int, itemsize: int) -> Iterator[DocBatch]:
    """Regroup document batches into shards: cut at the first document boundary where the
    raw size (tokens + 4-byte offsets) reaches ``budget``; a document is never split."""
    parts: list[DocBatch] = []
    used = 0
    for batch in batches:
        pos = 0
        ndocs = len(batch.offsets) - 1
        while pos < ndocs:
            # raw bytes after taking documents pos..k: used + (offsets[k+1]-offsets[pos])*itemsize + 4*(k+1-pos)
            rel = (batch.offsets[pos + 1 :] - batch.offsets[pos]) * itemsize + 4 * np.arange(1, ndocs - pos + 1)
            k = int(np.searchsorted(rel, budget - used, side="left"))
            if k >= ndocs - pos:  # the whole rest fits below the budget
                parts.append(_slice(batch, pos, ndocs))
                used += int(rel[-1])
                break
            end = pos + k + 1
            parts.append(_slice(batch, pos, end))
            yield _join(parts)
            parts, used = [], 0
            pos = end
    if parts:
        yield _join(parts)


def _slice(batch: DocBatch, a: int, b: int) -> DocBatch:
    lo, hi = batch.offsets[a], batch.offsets[b]
    return DocBatch(batch.tokens[lo:hi], batch.offsets[a : b + 1] - lo)


def _join(parts: list[DocBatch]) -> DocBatch:
    if len(parts) == 1:
        return parts[0]
    tokens = np.concatenate([p.tokens for p in parts])
    lengths = np.concatenate([np.diff(p.offsets) for p in parts])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return DocBatch(tokens, offsets)


def _with_eos(batch: DocBatch, eos_id: int) -> DocBatch:
    ends = batch.offsets[1:]
    tokens = np.insert(batch.tokens, ends, eos_id)
    return DocBatch(tokens, batch.offsets + np.arange(len(batch.offsets)))


def _check_range(batch: DocBatch, vocab_size: int, where: str) -> None:
    if batch.tokens.size == 0:
        return
    lo, hi = int(batch.tokens.min()), int(batch.tokens.max())
    if lo < 0 or hi >= vocab_size:
        bad = lo if lo < 0 else hi
        doc = int(np.searchsorted(batch.offsets, int(np.flatnonzero(batch.tokens == bad)[0]), side="right")) - 1
        raise TokenRangeError(f"{where}: token id {bad} in document {doc} is outside the vocabulary [0, {vocab_size})")


def _store_shard(job: _Job, batch: DocBatch) -> ShardInfo:
    raw = encode_shard(batch.tokens, batch.offsets, job.dtype)
    stored = compress(raw, job.level)
    raw_digest = digest_bytes(raw)
    path = f"{SHARDS_DIR}/{raw_digest.split(':', 1)[1]}{SHARD_SUFFIX}"
    loc = resolve(job.out_url, job.storage_options)
    if not (loc.exists(path) and loc.size(path) == len(stored)):
        loc.write_bytes(path, stored)
    return ShardInfo(
        path=path,
        documents=len(batch.offsets) - 1,
        tokens=int(batch.offsets[-1]),
        stored_bytes=len(stored),
        raw_bytes=len(raw),
        stored_digest=digest_bytes(stored),
        raw_digest=raw_digest,
    )


def _pack_batches(job: _Job, batches: Iterable[DocBatch], where: str) -> _UnitResult:
    itemsize = np.dtype(job.dtype).itemsize

    def prepared() -> Iterator[DocBatch]:
        for batch in batches:
            _check_range(batch, job.vocab_size, where)
            yield _with_eos(batch, job.eos_id) if job.eos_id is not None else batch

    shards = [_store_shard(job, b) for b in _cut_shards(prepared(), job.source.shard_size, itemsize)]
    return _UnitResult(shards, sum(s.documents for s in shards), sum(s.tokens for s in shards))


def _pack_unit(job: _Job, unit: Unit) -> _UnitResult:
    where = unit.path if unit.stop is None else f"{unit.path}[{unit.start}:{unit.stop}]"
    return _pack_batches(job, read_unit(unit, job.source), where)


def _resolve_tokenizer(opts: PackOptions) -> tuple[Tokenizer, Any]:
    if opts.tokenizer is not None:
        tok = load_tokenizer(opts.tokenizer, opts.eos_token)
        eos = opts.eos_id if opts.eos_id is not None else tok.info.eos_id
        vocab = opts.vocab_size or tok.info.vocab_size
        return Tokenizer(tok.info.name, vocab, eos), tok
    if opts.vocab_size is None:
        raise UsageError("token-id input needs --vocab-size (or pass --tokenizer for text input)")
    return Tokenizer("none", opts.vocab_size, opts.eos_id), None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _progress(total: int, enabled: bool | None) -> Any:
    from tqdm import tqdm

    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, unit="unit", disable=not show, dynamic_ncols=True, desc="packing")


def _run(
    out_url: str,
    opts: PackOptions,
    info: Tokenizer,
    work: Callable[[_Job], Iterator[_UnitResult]],
    source: SourceOptions,
    total_units: int,
) -> PackResult:
    started = time.perf_counter()
    out = resolve(out_url, opts.storage_options)
    previous: Manifest | None = None
    if opts.append:
        try:
            previous = load_manifest(out)
        except DatasetNotFoundError:
            previous = None
    elif out.exists("manifest.json"):
        raise UsageError(f"{out_url} already holds a dataset; pass --append to add a version to it")
    if opts.append_eos and info.eos_id is None:
        raise UsageError("appending EOS needs an EOS id: pass --eos-id (or --no-eos)")
    dtype = dtype_for_vocab(info.vocab_size)
    name = opts.name or out_url.rstrip("/").rsplit("/", 1)[-1]
    if previous is not None:
        _check_compatible(previous, name if opts.name else previous.name, dtype, info, opts.append_eos)
        name = previous.name
    job = _Job(
        out_url,
        dict(opts.storage_options),
        source,
        dtype,
        info.vocab_size,
        info.eos_id if opts.append_eos else None,
        opts.compression_level,
    )
    rows: list[ShardInfo] = []
    bar = _progress(total_units, opts.progress)
    tokens = stored = 0
    try:
        for result in work(job):
            rows.extend(result.shards)
            tokens += result.tokens
            stored += sum(s.stored_bytes for s in result.shards)
            elapsed = max(time.perf_counter() - started, 1e-9)
            bar.set_postfix(
                tokens=f"{tokens / 1e6:.1f}M",
                tok_s=f"{tokens / elapsed / 1e6:.1f}M",
                MB_s=f"{stored / elapsed / 1e6:.1f}",
                refresh=False,
            )
            bar.update(1)
    finally:
        bar.close()
    new_table = ShardTable.from_rows(rows)
    table = previous.shards.concat(new_table) if previous is not None else new_table
    manifest, table_data = Manifest.build(
        name=name,
        token_dtype=dtype,
        tokenizer=info,
        eos_appended=opts.append_eos,
        shards=table,
        parent=previous.version_id if previous else None,
        created_at=_now(),
        tool_version=__version__,
    )
    publish_version(
        out,
        manifest,
        table_data,
        expect_current=previous.version_id if previous else None,
        new_shards=[r.path for r in rows],
    )
    totals = manifest.totals
    return PackResult(
        url=out_url,
        version_id=manifest.version_id,
        parent=manifest.parent,
        shards=totals["shards"],
        new_shards=len(rows),
        documents=totals["documents"],
        tokens=totals["tokens"],
        stored_bytes=totals["stored_bytes"],
        raw_bytes=totals["raw_bytes"],
        seconds=time.perf_counter() - started,
    )


def _check_compatible(prev: Manifest, name: str, dtype: str, info: Tokenizer, eos: bool) -> None:
    if prev.name != name:
        raise UsageError(f"--name {name!r} differs from the dataset's name {prev.name!r}")
    if prev.token_dtype != dtype or prev.tokenizer != info or prev.eos_appended != eos:
        raise UsageError(
            f"cannot append: the dataset has dtype {prev.token_dtype}, tokenizer {prev.tokenizer}, "
            f"eos_appended={prev.eos_appended}; this pack would have {dtype}, {info}, eos_appended={eos}"
        )


def pack(inputs: Sequence[str], out: str, options: PackOptions | None = None) -> PackResult:
    """Pack corpus files into a dataset at ``out`` (any fsspec URL) and publish a version."""
    opts = options or PackOptions()
    info, tok = _resolve_tokenizer(opts)
    source = SourceOptions(
        tokenizer=tok,
        tokens_column=opts.tokens_column,
        text_column=opts.text_column,
        text_per_line=opts.text_per_line,
        eos_id=info.eos_id,
        shard_size=opts.shard_size,
        storage_options=dict(opts.input_storage_options) or None,
    )
    units = plan_units(list(inputs), source, opts.input_format)

    def work(job: _Job) -> Iterator[_UnitResult]:
        if opts.workers == 1 or len(units) == 1:
            for unit in units:
                yield _pack_unit(job, unit)
            return
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(max_workers=min(opts.workers, len(units)), mp_context=ctx) as pool:
            futures = [pool.submit(_pack_unit, job, u) for u in units]
            try:
                for fut in futures:  # in unit order: the output never depends on scheduling
                    yield fut.result()
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise

    return _run(out, opts, info, work, source, len(units))


def pack_documents(
    documents: Iterable[Sequence[int] | np.ndarray], out: str, options: PackOptions | None = None
) -> PackResult:
    """Pack in-memory documents (lists or arrays of token ids) — for tests, notebooks and tools."""
    opts = options or PackOptions()
    info, _ = _resolve_tokenizer(opts)
    source = SourceOptions(eos_id=info.eos_id, shard_size=opts.shard_size)

    def batches() -> Iterator[DocBatch]:
        chunk: list[np.ndarray] = []
        for doc in documents:
            chunk.append(np.asarray(doc, dtype=np.int64))
            if len(chunk) >= 4096:
                yield _from_list(chunk)
                chunk = []
        if chunk:
            yield _from_list(chunk)

    def work(job: _Job) -> Iterator[_UnitResult]:
        yield _pack_batches(job, batches(), "documents")

    return _run(out, opts, info, work, source, 1)


def _from_list(docs: list[np.ndarray]) -> DocBatch:
    from .sources.base import batch_from_lists

    return batch_from_lists(docs)
