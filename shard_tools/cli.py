"""The ``ferry`` command line: a dispatcher plus the data commands (pack, inspect, verify, export).

Subcommands come from the ``ferry.commands`` entry points (each a ``register(subparsers)``
function), so ``service`` and ``client`` add theirs without ``shard_tools`` importing them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import unicodedata
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any, TypeVar

from . import __version__
from .errors import FerryError, UsageError
from .units import format_bytes

__all__ = [
    "main",
    "register",
    "parse_storage_options",
    "print_json",
    "print_lines",
    "printable",
    "printable_fields",
    "print_error",
]

T = TypeVar("T")
# Controls (C0, DEL, C1: ESC and CSI start terminal sequences), format characters (bidi overrides,
# zero-width joiners), line and paragraph separators (U+2028/9) and lone surrogates: a value read from
# storage or the network must not move the cursor, recolour or rewrite the terminal, nor forge a line.
_UNPRINTABLE = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def printable(text: str) -> str:
    """``text`` with every control, format or separator character shown as a Python escape
    (``\\x1b``, ``\\n``, ``\\u202e``): what every CLI line that shows a stored or served value goes through."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(repr(ch)[1:-1] if unicodedata.category(ch) in _UNPRINTABLE else ch for ch in text)


def printable_fields(obj: T) -> T:
    """A copy of ``obj`` with every string in it made :func:`printable` (dicts, lists, tuples, dataclasses)."""
    if isinstance(obj, str):
        return printable(obj)  # type: ignore[return-value]
    if isinstance(obj, list):
        return [printable_fields(v) for v in obj]  # type: ignore[return-value]
    if type(obj) is tuple:  # a namedtuple keeps its fields as they are
        return tuple(printable_fields(v) for v in obj)  # type: ignore[return-value, attr-defined]
    if isinstance(obj, dict):
        return {printable(str(k)): printable_fields(v) for k, v in obj.items()}  # type: ignore[return-value]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: printable_fields(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}
        return dataclasses.replace(obj, **changes)
    return obj


def print_error(command: str, exc: BaseException | str) -> None:
    """The one ``ferry CMD: error: MESSAGE`` line every command ends with on an error: one line (a message
    quoting a multi-line library error is joined with ``; ``) with every control character escaped."""
    message = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    sys.stderr.write(f"ferry {printable(command)}: error: {printable(message)}\n")
    sys.stderr.flush()


def parse_storage_options(pairs: Sequence[str] | None) -> dict[str, Any]:
    """``["key=value", ...]`` → dict; values that parse as JSON (numbers, true/false) are converted."""
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--storage-option expects key=value, got {pair!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    nested: dict[str, Any] = {}
    for key, value in out.items():  # client_kwargs.endpoint_url=... → {"client_kwargs": {"endpoint_url": ...}}
        *parents, leaf = key.split(".")
        node = nested
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return nested


def print_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout, ASCII only: every control character (DEL included), bidi
    override and line separator in a string is a ``\\u`` escape, never raw."""
    sys.stdout.write(json.dumps(obj, indent=2, sort_keys=False, default=str).replace("\x7f", "\\u007f") + "\n")


def print_lines(lines: Sequence[str], file: Any = None) -> None:
    """Each line :func:`printable` (values read from storage or the network in it cannot forge a line or send
    a terminal escape), then a newline."""
    out = sys.stdout if file is None else file
    out.write("".join(printable(line) + "\n" for line in lines))


def _add_storage(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage-option",
        "-S",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option for the dataset URL (repeatable; dotted keys nest, "
        "e.g. client_kwargs.endpoint_url=http://127.0.0.1:9000)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add pack, inspect, verify and export."""
    _add_pack(sub)
    _add_inspect(sub)
    _add_verify(sub)
    _add_export(sub)


def _add_stored_form(p: argparse.ArgumentParser) -> None:
    """``ferry pack``'s options of the stored shards: size, compression, format and frame size."""
    p.add_argument("--shard-size", default="128MiB", help="target raw bytes per shard (default: 128MiB)")
    p.add_argument("--compression", default="zstd:1", help="zstd:LEVEL, 1..22 (default: zstd:1)")
    p.add_argument(
        "--format",
        type=int,
        choices=[1, 2, 3],
        default=None,
        dest="stored_format",
        help="stored shard format: 3 (default) seekable zstd frames + a frame index whose raw digests bind every "
        "frame to the shard's raw digest, read by frames without the whole shard (global shuffle, cold starts "
        "from remote; ferry before format 3 cannot read it); 2 the same without per-frame raw digests (what "
        "ferry before format 3 reads; read whole, not by frames, by this ferry); 1 one zstd frame per shard "
        "(what ferry before format 2 reads)",
    )
    p.add_argument(
        "--frame-size",
        help="raw bytes per frame of --format 3 or 2 (default 512KiB; 4KiB..64MiB): a sample read by frames costs "
        "about one frame, so frames near the sample size (e.g. 4KiB for 2048 uint16 tokens) suit global shuffle "
        "from remote, at some compression ratio",
    )


def _add_pack(sub: argparse._SubParsersAction) -> None:
    """``ferry pack`` and every one of its options."""
    p = sub.add_parser(
        "pack",
        help="pack corpus files into a dataset of shards + manifest",
        description="Pack Parquet, JSONL, text, .npy, Arrow, Megatron .bin/.idx or Hugging Face dataset "
        "directory inputs into "
        "immutable zstd-compressed Arrow shards and publish a manifest at --out.",
    )
    p.add_argument(
        "inputs",
        nargs="*",
        help="input files or URLs (format by suffix, or --input-format); a Megatron dataset is given by its "
        ".bin or .idx file, a Hugging Face dataset (save_to_disk or the Hub's data/<split>-*.parquet) by its "
        "directory. Inputs are only read, never modified",
    )
    p.add_argument("--out", required=True, help="dataset URL (local path, file://, s3://, gs://, memory://)")
    p.add_argument("--input-format", choices=["parquet", "jsonl", "text", "npy", "megatron", "arrow", "wds", "hf"])
    p.add_argument("--split", help="the split of a Hugging Face dataset directory (needed when it has several)")
    p.add_argument(
        "--no-origin",
        action="store_true",
        help="do not record each document's input file and row/line (for ferry trace) in the shards; "
        "then the same inputs packed from another path give the same version id",
    )
    p.add_argument(
        "--tokenizer",
        help="'bytes' (built-in byte-level), a tokenizer.json path, a Hugging Face model directory (tokenizer.json "
        "+ tokenizer_config.json, EOS from the config) or tiktoken:PATH (a local tiktoken BPE file); for text "
        "inputs. Omit for token-id inputs",
    )
    p.add_argument(
        "--eos-token",
        help="EOS token string of a tokenizer.json (default: a model directory's tokenizer_config.json, else guessed)",
    )
    p.add_argument("--vocab-size", type=int, help="vocabulary size (required for token-id inputs)")
    p.add_argument("--eos-id", type=int, help="EOS token id (default: the tokenizer's)")
    p.add_argument("--no-eos", action="store_true", help="do not append EOS to each document")
    p.add_argument("--tokens-column", default="tokens", help="token-id list column/field (default: tokens)")
    p.add_argument("--text-column", default="text", help="text column/field (default: text)")
    p.add_argument("--lines", action="store_true", help="text files: one document per line (default: per file)")
    _add_stored_form(p)
    p.add_argument("--workers", type=int, default=1, help="worker processes (output is identical for any N)")
    p.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="local: this machine (--workers processes); ray: one Ray task per unit (needs the 'ray' extra)",
    )
    p.add_argument("--ray-address", help="Ray cluster address for --executor ray (default: start a local Ray)")
    p.add_argument(
        "--part",
        metavar="I/N",
        help="pack only units i with i %% N == I and store a part record under --out/parts/; run every I "
        "in 0..N-1 (e.g. a Slurm array), then --merge",
    )
    p.add_argument("--merge", action="store_true", help="publish one version from the part records of a --part run")
    p.add_argument("--run-id", help="the run to --merge (default: the only run under parts/), or to name a --part run")
    p.add_argument("--parts", type=int, help="with --merge and INPUTS: N of the --part run (to compute its run id)")
    p.add_argument("--name", help="dataset name (default: last part of --out); no control characters")
    p.add_argument("--append", action="store_true", help="publish a new version adding shards to an existing dataset")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary")
    _add_media(p)
    _add_storage(p)
    p.add_argument(
        "--input-storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="fsspec storage option for input URLs (repeatable, dotted keys nest)",
    )
    p.set_defaults(func=_cmd_pack)


def _add_media(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--media-policy",
        metavar="NAME[:KEY=VALUE,...]",
        help="pack media (images, WAV audio) with placeholder spans costed by this policy, e.g. "
        "patch:max_side=448,patch=14 (see docs/guides/multimodal.md); needs a --tokenizer",
    )
    p.add_argument("--media-column", default="image", help="image column of Parquet / HF inputs (default: image)")
    p.add_argument(
        "--skip-bad-media",
        action="store_true",
        help="leave out (and count) media items that are truncated, undecodable or too large instead of failing",
    )


def _add_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="summarise a dataset: totals, versions, shards")
    p.add_argument("url")
    p.add_argument("--version", help="a published version id (default: current)")
    p.add_argument("--shards", action="store_true", help="list every shard")
    p.add_argument(
        "--media",
        action="store_true",
        help="read every shard (verified) to show media kinds, formats and the distribution of their token costs",
    )
    p.add_argument("--json", action="store_true")
    _add_storage(p)
    p.set_defaults(func=_cmd_inspect)


def _add_verify(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="re-read every shard and check every digest and count",
        description="Exit status 0 when every shard verifies, 1 naming each bad shard.",
    )
    p.add_argument("url")
    p.add_argument("--version", help="a published version id (default: current)")
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--json", action="store_true")
    _add_storage(p)
    p.set_defaults(func=_cmd_verify)


def _add_export(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a dataset back out in another format")
    p.add_argument("url")
    p.add_argument("--format", choices=["megatron"], required=True)
    p.add_argument("--out", required=True, help="output prefix (writes PREFIX.bin and PREFIX.idx)")
    p.add_argument("--strip-eos", action="store_true", help="drop the EOS appended at pack time")
    p.add_argument("--json", action="store_true")
    _add_storage(p)
    p.set_defaults(func=_cmd_export)


def _compression_level(spec: str) -> int:
    algo, _, level = spec.partition(":")
    if algo != "zstd":
        raise UsageError(f"--compression {spec!r}: only zstd is supported (zstd:LEVEL)")
    try:
        return int(level) if level else 1
    except ValueError:
        raise UsageError(f"--compression {spec!r}: level must be an integer") from None


def _cmd_pack(args: argparse.Namespace) -> int:
    from .format.seekable import DEFAULT_FRAME_SIZE
    from .packer.packing import PackOptions, merge_parts, pack, pack_part, parse_part_spec
    from .units import parse_size

    if args.merge and args.part:
        raise UsageError("--merge and --part are separate steps: run each --part I/N, then --merge")
    if not args.inputs and not args.merge:
        raise UsageError("no input files given (ferry pack INPUT... --out URL)")
    if args.frame_size is not None and args.stored_format == 1:
        raise UsageError("--frame-size applies to formats 2 and 3 only (--format 1 stores each shard as one frame)")
    opts = PackOptions(
        name=args.name,
        tokenizer=args.tokenizer,
        eos_token=args.eos_token,
        vocab_size=args.vocab_size,
        eos_id=args.eos_id,
        append_eos=not args.no_eos,
        input_format=args.input_format,
        split=args.split,
        origin=not args.no_origin,
        tokens_column=args.tokens_column,
        text_column=args.text_column,
        text_per_line=args.lines,
        shard_size=parse_size(args.shard_size),
        compression_level=_compression_level(args.compression),
        **({} if args.stored_format is None else {"stored_format": args.stored_format}),
        frame_size=DEFAULT_FRAME_SIZE if args.frame_size is None else parse_size(args.frame_size),
        workers=args.workers,
        executor=args.executor,
        ray_address=args.ray_address,
        append=args.append,
        storage_options=parse_storage_options(args.storage_option),
        input_storage_options=parse_storage_options(args.input_storage_option),
        media_policy=args.media_policy,
        media_column=args.media_column,
        skip_bad_media=args.skip_bad_media,
    )
    if args.part:
        part, parts = parse_part_spec(args.part)
        pr = pack_part(args.inputs, args.out, part, parts, opts, run_id=args.run_id)
        if args.json:
            print_json(pr.to_dict())
        else:
            print(
                f"part {pr.part}/{pr.parts} of run {pr.run_id}: {pr.units} units, {pr.shards} shards, "
                f"{pr.tokens:,} tokens stored; record {pr.url}/{pr.record}"
            )
        return 0
    if args.merge:
        result = merge_parts(args.out, opts, run_id=args.run_id, inputs=args.inputs, parts=args.parts)
    else:
        result = pack(args.inputs, args.out, opts)
    if args.json:
        print_json(result.to_dict())
    else:
        print(
            f"packed {result.documents:,} documents, {result.tokens:,} tokens into {result.shards} shards "
            f"({result.new_shards} new) at {result.url}"
        )
        print(
            f"version {result.version_id}  stored {format_bytes(result.stored_bytes)} "
            f"(raw {format_bytes(result.raw_bytes)})  {result.tokens_per_second / 1e6:.1f} Mtok/s"
        )
        if result.media_items or result.skipped_media:
            print(
                f"media     {result.media_items:,} items, {format_bytes(result.media_bytes)}"
                + (f"; {result.skipped_media:,} bad items left out (--skip-bad-media)" if result.skipped_media else "")
            )
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .dataset import list_versions, load_manifest
    from .storage.store import resolve

    loc = resolve(args.url, parse_storage_options(args.storage_option))
    m = load_manifest(loc, args.version)
    versions = sorted(list_versions(loc))
    shards = [vars(s) for s in m.shards] if args.shards else None
    costs = _media_costs(loc, m) if args.media else None
    if args.json:
        doc = {
            "url": args.url,
            "version_id": m.version_id,
            **{k: v for k, v in m.body().items()},
            "created_at": m.created_at,
            "tool_version": m.tool_version,
            "versions": versions,
        }
        if shards is not None:
            doc["shards"] = shards
        if costs is not None:
            doc["media_costs"] = costs
        print_json(doc)
        return 0
    t = m.totals
    lines = [
        f"dataset   {m.name}  ({args.url})",
        f"version   {m.version_id}  parent {m.parent or '-'}  created {m.created_at}  by ferry {m.tool_version}",
        f"tokens    {t['tokens']:,} {m.token_dtype}  in {t['documents']:,} documents, {t['shards']:,} shards",
        f"bytes     stored {format_bytes(t['stored_bytes'])}  raw {format_bytes(t['raw_bytes'])}"
        + (f"  ratio {t['stored_bytes'] / t['raw_bytes']:.3f}" if t["raw_bytes"] else ""),
        f"tokenizer {m.tokenizer.name}  vocab {m.tokenizer.vocab_size:,}  eos {m.tokenizer.eos_id}"
        f"  eos appended: {'yes' if m.eos_appended else 'no'}",
        f"versions  {len(versions)}: {', '.join(versions)}",
    ]
    if m.media is not None:
        policy = ",".join(f"{k}={v}" for k, v in m.media.to_dict().items() if k != "name")
        lines.insert(
            5, f"media     {t['media_items']:,} items, {format_bytes(t['media_bytes'])}  policy {m.media.name}:{policy}"
        )
    for kind, c in (costs or {}).items():
        lines.append(
            f"  {kind:<8}{c['items']:>8,} items {format_bytes(c['bytes']):>10}  formats {c['formats']}  cost tokens "
            f"min {c['min']}  p50 {c['p50']}  p90 {c['p90']}  max {c['max']}  total {c['total']:,}"
        )
    if shards is not None:
        lines.append(f"{'#':>6}  {'path':<58} {'docs':>9} {'tokens':>12} {'stored':>10}")
        for i, s in enumerate(shards):
            stored = format_bytes(s["stored_bytes"])
            lines.append(f"{i:>6}  {s['path']:<58} {s['documents']:>9,} {s['tokens']:>12,} {stored:>10}")
    print_lines(lines)
    return 0


def _media_costs(loc: Any, m: Any) -> dict[str, dict[str, Any]]:
    """Per media kind: items, bytes, formats and the distribution of token costs, from every shard."""
    import numpy as np

    from .dataset import Dataset
    from .format.media import MEDIA_COLUMN, MediaMeta

    ds = Dataset(loc, m)
    costs: dict[str, list[int]] = {}
    sizes: dict[str, int] = {}
    formats: dict[str, dict[str, int]] = {}
    for i in range(len(ds)):
        view = ds.read_shard(i)
        if MEDIA_COLUMN not in view.table.schema.names:
            continue
        meta = MediaMeta.from_column(view.table.column(MEDIA_COLUMN), m.shards[i].path)
        lengths = np.diff(meta.data_offsets)
        for j, kind in enumerate(meta.kind):
            costs.setdefault(kind, []).append(int(meta.cost[j]))
            sizes[kind] = sizes.get(kind, 0) + int(lengths[j])
            kinds = formats.setdefault(kind, {})
            kinds[meta.format[j]] = kinds.get(meta.format[j], 0) + 1
    out: dict[str, dict[str, Any]] = {}
    for kind, values in sorted(costs.items()):
        arr = np.asarray(values)
        out[kind] = {
            "items": len(values),
            "bytes": sizes[kind],
            "formats": formats[kind],
            "min": int(arr.min()),
            "p50": int(np.percentile(arr, 50)),
            "p90": int(np.percentile(arr, 90)),
            "max": int(arr.max()),
            "total": int(arr.sum()),
        }
    return out


def _cmd_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .verification import verify

    bar = tqdm(unit="B", unit_scale=True, disable=args.json or not sys.stderr.isatty(), desc="verifying")
    report = verify(
        args.url,
        storage_options=parse_storage_options(args.storage_option),
        version=args.version,
        threads=args.threads,
        on_shard=bar.update,
    )
    bar.close()
    if args.json:
        print_json(report.to_dict())
    elif report.error:
        print_lines([f"FAILED {args.url}: {report.error}"], sys.stderr)
    elif report.bad:
        bad = [f"BAD {path}: {reason}" for path, reason in report.bad.items()]
        print_lines([*bad, f"FAILED: {len(report.bad)} of {report.shards} shards bad at {args.url}"], sys.stderr)
    else:
        print_lines(
            [
                f"OK: {report.shards} shards, {format_bytes(report.bytes_read)} verified at {args.url} "
                f"(version {report.version_id})"
            ]  # fmt: skip
        )
    return 0 if report.ok else 1


def _cmd_export(args: argparse.Namespace) -> int:
    from .export import export_megatron

    n = export_megatron(
        args.url, args.out, storage_options=parse_storage_options(args.storage_option), keep_eos=not args.strip_eos
    )
    if args.json:
        print_json({"documents": n, "bin": args.out + ".bin", "idx": args.out + ".idx"})
    else:
        print(f"exported {n:,} documents to {args.out}.bin / {args.out}.idx")
    return 0


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``ferry`` parser. Given the ``command`` about to run, only the entry point that owns it
    is loaded (other packages' commands may import heavy libraries such as torch); otherwise all."""
    parser = argparse.ArgumentParser(
        prog="ferry",
        description="ferry: pack tokenized training data, replicate it across clusters, stream it into training.",
    )
    parser.add_argument("--version", action="version", version=f"ferry {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    eps = sorted(entry_points(group="ferry.commands"), key=lambda e: e.name)
    if any(ep.name == command for ep in eps):
        eps = [ep for ep in eps if ep.name == command]
    registered = set()
    for ep in eps:
        if ep.value in registered:
            continue
        registered.add(ep.value)
        try:
            ep.load()(sub)
        except ImportError as exc:  # an extra is not installed: say so instead of hiding commands
            sub.add_parser(ep.name, help=f"(unavailable: {exc})")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # No ferry command does linear algebra; numpy's OpenBLAS would otherwise start a spinning
    # thread per core at import (CPU time every run pays for nothing). A user's value wins.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    if argv[:1] == ["--version"]:  # answered without loading every command's package (fastapi, torch)
        print(f"ferry {__version__}")
        return 0
    parser = build_parser(first)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except FerryError as exc:
        print_error(args.command, exc)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"ferry {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `ferry inspect URL | head`: the reader left; exit quietly like other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
